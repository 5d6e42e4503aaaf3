"""The dashboard's page addresses (``st.Page``'s ``url_path``), for the app that registers the pages
(``app.py``) and the server that answers their addresses (``serve.py``), and the page it answers them with.

Streamlit's browser code does not know where its server is: it guesses from the page's address, and
for ``/job?…`` tries ``/job`` as the server first, then ``/``. The wrong guess costs a retry after
about a tenth of a second, on every page opened by its address (a link from the jobs list, an alert,
a bookmark): a ninth of a 64-GPU job page's time (``bench/browser_page.py``). Streamlit takes the
server's address from ``window.__streamlit.BACKEND_BASE_URL`` when a page sets it (its hook for hosting
an app elsewhere); :func:`page_html` sets it to the address's own folder, which under a site's proxy
prefix is the prefix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from streamlit import file_util

from jobsight.rules import links

# Not in jobsight.rules.links: nothing outside the dashboard links to them yet; they belong there,
# beside AUDIT_PAGE, once an alert or a report does.
ACTIONS_PAGE: Final = "actions"
SUSPECTS_PAGE: Final = "suspects"

ALL: Final = (links.JOBS_PAGE, links.JOB_PAGE, links.AUDIT_PAGE, links.ATTENTION_PAGE, ACTIONS_PAGE, SUSPECTS_PAGE)
"""Every page's address but the root's (Streamlit's guess is right there)."""

BASE_URL_SCRIPT: Final = '<script>window.__streamlit={BACKEND_BASE_URL:new URL("./",location.href).href};</script>'
"""First in the page's head: Streamlit's scripts read (and freeze) ``window.__streamlit`` as they load."""


CHART_CODE_GLOB: Final = "ArrowVegaLiteChart.*.js"
"""Streamlit's code for drawing a Vega-Lite chart (its name carries a hash of the release's build)."""


def chart_code() -> str | None:
    """The file name of Streamlit's chart code in its ``static/js``; ``None`` when a release names it otherwise."""
    found = sorted(Path(file_util.get_static_dir(), "static", "js").glob(CHART_CODE_GLOB))
    return found[0].name if len(found) == 1 else None


def chart_code_script(name: str) -> str:
    """A script that loads Streamlit's chart code (Vega, Vega-Lite and the chart element) once the page has
    loaded. Streamlit loads it when the first chart arrives, so a job page, whose first chart comes after
    its reads, paid that load and Vega's start after the reads. Loaded from the address Streamlit's own
    bundle imports it from, so the browser has it once, ready when the chart comes."""
    return ('<script type="module">addEventListener("load", () => '
            f'import(new URL("./static/js/{name}", location.href).href).catch(() => undefined));</script>')


def page_html() -> str:
    """Streamlit's own ``index.html`` with :data:`BASE_URL_SCRIPT` first in its head and, last in it, the
    early load of the chart code (:func:`chart_code_script`) where the release has the file it names."""
    index = Path(file_util.get_static_dir(), "index.html").read_text(encoding="utf-8")
    if (code := chart_code()) is not None:
        end = index.index("</head>")
        index = index[:end] + chart_code_script(code) + index[end:]
    head = index.index("<head>") + len("<head>")
    return index[:head] + BASE_URL_SCRIPT + index[head:]
