"""The dashboard's server, which ``jobsight dashboard`` runs with ``streamlit run``: Streamlit's own
(``st.App``) serving ``app.py``, each page's address answered by a page that names the server
(:mod:`jobsight.dashboard.page_paths`). Streamlit finds ``app`` by reading this file; importing it
builds the server, so nothing else imports it."""

from __future__ import annotations

from pathlib import Path

import streamlit as st
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from jobsight.dashboard import page_paths

PAGE = page_paths.page_html()


async def page(_: Request) -> HTMLResponse:
    # As Streamlit serves its index.html: never cached, so a new release's bundle names are read.
    return HTMLResponse(PAGE, headers={"Cache-Control": "no-cache"})


app = st.App(Path(__file__).resolve().parent / "app.py",
             routes=[Route(f"/{path}", page, methods=["GET", "HEAD"]) for path in page_paths.ALL])
