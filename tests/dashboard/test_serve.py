"""The dashboard's server (jobsight.dashboard.serve): every page's address is answered by a page that
names its server (jobsight.dashboard.page_paths), so that the browser does not first guess the page's
address as the server's. tests/dashboard/test_browser.py checks that a browser asks the server alone."""

from __future__ import annotations

import ast
from pathlib import Path

from jobsight.dashboard import page_paths
from jobsight.rules import links
from tests.dashboard.conftest import APP

START = "start"
"""The hidden root page's address (it forwards to the jobs list): served at ``/``, where Streamlit guesses right."""


def _registered_paths(app: Path) -> list[str]:
    """Each ``st.Page(…, url_path=…)`` of ``app``, its address resolved from the names it is written with."""
    names = {"links": links, **{name: getattr(page_paths, name) for name in ("ACTIONS_PAGE", "SUSPECTS_PAGE")}}
    paths = []
    for node in ast.walk(ast.parse(app.read_text())):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "st.Page":
            value = next(k.value for k in node.keywords if k.arg == "url_path")
            paths.append(eval(ast.unparse(value), {}, names))  # noqa: S307 - the app's own source, names only
    return paths


def test_every_page_the_app_registers_is_served_with_its_servers_address() -> None:
    registered = _registered_paths(Path(APP))
    assert START in registered and len(registered) > 3
    assert sorted(set(registered) - {START}) == sorted(page_paths.ALL)


def test_the_page_names_its_server_before_streamlits_scripts_load() -> None:
    html = page_paths.page_html()
    assert html.count(page_paths.BASE_URL_SCRIPT) == 1
    # Streamlit reads and freezes window.__streamlit as its bundle loads: the setting is the page's first script.
    assert html.index("<script") == html.index(page_paths.BASE_URL_SCRIPT) < html.index("static/js/")


def test_the_page_loads_streamlits_chart_code_once_it_has_loaded() -> None:
    """The chart code this Streamlit release ships is named, once, after Streamlit's own scripts; an
    upgrade that renames it fails here rather than silently losing the early load."""
    code = page_paths.chart_code()
    assert code is not None and code.startswith("ArrowVegaLiteChart.") and code.endswith(".js")
    html = page_paths.page_html()
    assert html.count(page_paths.chart_code_script(code)) == 1
    assert html.index("static/js/index.") < html.index(page_paths.chart_code_script(code)) < html.index("</head>")
