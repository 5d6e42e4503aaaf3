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


def page_html() -> str:
    """Streamlit's own ``index.html`` with :data:`BASE_URL_SCRIPT` first in its head."""
    index = Path(file_util.get_static_dir(), "index.html").read_text(encoding="utf-8")
    head = index.index("<head>") + len("<head>")
    return index[:head] + BASE_URL_SCRIPT + index[head:]
