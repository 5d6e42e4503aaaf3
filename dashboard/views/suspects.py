"""Suspect GPUs (admins): the GPUs that kept hurting jobs over the last days — hardware Xid errors,
error counters that rose, memory flags, straggler and hung findings they caused — with the jobs
each touched, each opening its job's page, and the line that would drain its node.

jobsight never drains a node by itself: the line is a suggestion for an admin to read and run, made
only for a GPU that hurt at least the site's ``suspect_alert_jobs`` distinct jobs (3 by default); one
that hurt fewer is shown as worth watching. The line is shown as code, never as Markdown; a node whose
name a shell could read gets no line at all
(:meth:`jobsight.collector.query.suspects.SuspectGpu.drain_suggestion`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import pandas as pd
import streamlit as st

from jobsight.dashboard import data, tables, url_state
from jobsight.dashboard.identity import viewer_or_stop
from jobsight.dashboard.markup import plain
from jobsight.dashboard.settings import dashboard_settings
from jobsight.dashboard.url_state import Param
from jobsight.rules import links

settings = dashboard_settings()
viewer = viewer_or_stop(settings)
st.title("Suspect GPUs")
if not viewer.is_admin:
    st.error("The suspect GPUs are for admins only.")
    st.stop()

DEFAULT_DAYS = 7
MOST_DAYS = 366


def _days(text: str) -> int | None:
    return int(text) if text.isdigit() and 1 <= int(text) <= MOST_DAYS else None


# The period in the address: /suspects?days=30 (left out at the default week).
FILTERS = [Param("days", "suspects_days", DEFAULT_DAYS, _days)]
url_state.restore(FILTERS)
days = int(st.number_input("Days", min_value=1, max_value=MOST_DAYS, step=1, key="suspects_days",
                           help="how far back to look, up to now"))
url_state.store(FILTERS)
st.caption("jobsight never drains a node by itself: each line below is a suggestion for an admin to check and "
           "run, made only for a GPU that hurt several jobs; one that hurt fewer is worth watching. Xids an "
           "application raises itself (13, 31, 43, 45) are not held against a GPU.")

# Whole minutes, the end rounded up: the read is cached by its arguments, and a bound that moved every
# rerun would miss; rounded up, an Xid of the last seconds is still in.
until = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
gpus = data.suspects(viewer, until - dt.timedelta(days=days), until, cluster=settings.cluster)
if not gpus:
    st.success(f"No suspect GPUs in the last {days} day(s).")
    st.stop()


def _table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per GPU. Data frames show text as it is (no Markdown): a node's name needs no escaping here."""
    return pd.DataFrame({
        "GPU": [r["gpu"] for r in rows],
        "cluster": [r["cluster"] for r in rows],
        "jobs": [r["job_count"] for r in rows],
        "users": [r["user_count"] for r in rows],
        "job ids": [r["jobs"] for r in rows],
        "what it did": [r["summary"] for r in rows],
        "last seen": pd.to_datetime([r["last_at"] for r in rows], utc=True),
        "self-reported": [r["self_reported"] for r in rows],
    })


def _jobs(gpu: Mapping[str, Any]) -> pd.DataFrame:
    return pd.DataFrame({"open": [links.job_link(gpu["cluster"], job) for job in gpu["jobs"]],
                         "job": list(gpu["jobs"])})


def _gpu(gpu: Mapping[str, Any]) -> None:
    """One GPU: what it did, the drain line (as code: a shell line, nothing rendered), its jobs."""
    with st.container(border=True):
        st.markdown(f"**{plain(gpu['gpu'])}** · cluster {plain(gpu['cluster'])} · {gpu['job_count']} job(s)")
        st.caption(plain(gpu["summary"]) + (" · partly reported by runs outside Slurm, for their own GPUs"
                                            if gpu["self_reported"] else ""))
        if gpu["drain"]:
            st.code(gpu["drain"], language="bash")
        if gpu["worth_watching"]:
            st.info(f"Worth watching: it hurt {gpu['job_count']} job(s) of {gpu['user_count']} user(s). "
                    + (f"A drain is suggested from {gpu['drain_min_jobs']} jobs on (suspect_alert_jobs)."
                       if gpu["drain_min_jobs"] > 0 else "No drain is suggested (suspect_alert_jobs is 0)."))
        if not gpu["plain_node"]:
            st.warning(f"No drain line: the node's name {plain(gpu['node'] or 'unknown')} is not a plain host name, "
                       "so jobsight puts it in no command.")
        tables.show(_jobs(gpu), column_config={
            "open": st.column_config.LinkColumn("open", display_text="open")})


st.caption(f"{len(gpus)} GPU(s) hurt jobs in the last {days} day(s), most jobs first. “open” opens a job's page, "
           "where its Xids are marked on the timeline.")
tables.show(_table(gpus), column_config={
    "job ids": st.column_config.ListColumn("job ids"),
    "last seen": st.column_config.DatetimeColumn("last seen (UTC)", format="YYYY-MM-DD HH:mm", timezone="UTC"),
    "self-reported": st.column_config.CheckboxColumn(
        "self-reported", help="some of it came from a run outside Slurm, which speaks for its own GPUs"),
})
st.subheader("Each GPU")
for suspect in gpus:
    _gpu(suspect)
