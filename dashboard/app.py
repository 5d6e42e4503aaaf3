"""jobsight dashboard: the entry point ``jobsight up`` runs with ``streamlit run``.

It checks settings and identity once per rerun, then hands over to the page; the audit
and Attention pages are registered only for admins.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from jobsight.collector.settings import SettingsError
from jobsight.dashboard.identity import viewer_or_stop
from jobsight.dashboard.settings import load_dashboard_settings

PAGES = Path(__file__).resolve().parent / "views"

st.set_page_config(page_title="jobsight", layout="wide")

try:
    settings = load_dashboard_settings()
except SettingsError as exc:
    st.error(str(exc))
    st.stop()

viewer = viewer_or_stop(settings)

pages = [
    st.Page(PAGES / "jobs.py", title="Jobs", icon=":material/list:", url_path="jobs", default=True),
    st.Page(PAGES / "job.py", title="Job", icon=":material/monitoring:", url_path="job"),
]
if viewer.is_admin:
    pages.append(st.Page(PAGES / "audit.py", title="Audit", icon=":material/fact_check:", url_path="audit"))
    pages.append(st.Page(PAGES / "attention.py", title="Attention", icon=":material/notification_important:",
                         url_path="attention"))

with st.sidebar:
    st.caption(f"Signed in as **{viewer.name}**" + (" (admin)" if viewer.is_admin else ""))
    if settings.auth_mode == "oidc":
        st.button("Log out", on_click=st.logout)

st.navigation(pages).run()
