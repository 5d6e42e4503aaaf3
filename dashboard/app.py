"""jobsight dashboard: the entry point ``jobsight up`` runs with ``streamlit run``.

It checks settings and identity once per rerun, then hands over to the page; the audit,
Attention, Actions and Suspect GPUs pages are registered only for admins. Every page has its own address
(:mod:`jobsight.rules.links`): the root address forwards to ``/jobs``. A page that cannot read the database
says so and runs again every ``refresh_s`` until it reads (:mod:`jobsight.dashboard.read_outage`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import streamlit as st

from jobsight.collector.config.settings import SettingsError
from jobsight.dashboard import heap
from jobsight.dashboard.identity import viewer_or_stop
from jobsight.dashboard.markup import plain
from jobsight.dashboard.page_paths import ACTIONS_PAGE, SUSPECTS_PAGE
from jobsight.dashboard.settings import dashboard_settings
from jobsight.rules import links

PAGES = Path(__file__).resolve().parent / "views"

# The pool says why it could not connect at every attempt (each page's read, every refresh); the
# dashboard's own line says it once an outage (jobsight.dashboard.read_outage, which also has the page
# say so in words and run again until it reads).
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)

st.set_page_config(page_title="jobsight", layout="wide")

try:
    settings = dashboard_settings()
except SettingsError as exc:
    st.error(str(exc))
    st.stop()

viewer = viewer_or_stop(settings)

jobs = st.Page(PAGES / "jobs.py", title="Jobs", icon=":material/list:", url_path=links.JOBS_PAGE)


def start() -> None:
    """The app's root address opens the jobs list at its own address, ``/jobs``, so that the list
    has a link like every page (Streamlit serves its default page at ``/`` only)."""
    st.switch_page(jobs, query_params=st.query_params.to_dict())


pages = [
    st.Page(start, title="jobsight", url_path="start", default=True, visibility="hidden"),
    jobs,
    st.Page(PAGES / "job.py", title="Job", icon=":material/monitoring:", url_path=links.JOB_PAGE),
]
if viewer.is_admin:
    pages.append(st.Page(PAGES / "audit.py", title="Audit", icon=":material/fact_check:", url_path=links.AUDIT_PAGE))
    pages.append(st.Page(PAGES / "attention.py", title="Attention", icon=":material/notification_important:",
                         url_path=links.ATTENTION_PAGE))
    pages.append(st.Page(PAGES / "actions.py", title="Actions", icon=":material/gavel:", url_path=ACTIONS_PAGE))
    pages.append(st.Page(PAGES / "suspects.py", title="Suspect GPUs", icon=":material/memory:",
                         url_path=SUSPECTS_PAGE))

# The pages' links in a bar across the top, not a sidebar: the sidebar took 300 of a 1,600-pixel
# window's width, and the jobs list's and the audit's tables scrolled sideways in what was left.
page = st.navigation(pages, position="top")
signed_in_as = f"Signed in as **{plain(viewer.name)}**" + (" (admin)" if viewer.is_admin else "")
if settings.auth_mode == "oidc":
    signed_in, log_out = st.columns([6, 1], vertical_alignment="center")
    signed_in.caption(signed_in_as)
    log_out.button("Log out", on_click=st.logout)
else:  # one element, not a row of two columns with nothing in one (every element costs the browser)
    st.caption(signed_in_as)
try:
    page.run()
finally:
    # After the page (a rerun or a stop ends it with an exception): it is what imports the modules.
    heap.settle()
