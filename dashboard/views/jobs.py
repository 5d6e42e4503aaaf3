"""Jobs: running first, filterable, each row opening its job page."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import streamlit as st

from jobsight.dashboard import data, job_groups, tables, url_state
from jobsight.dashboard.identity import viewer_or_stop
from jobsight.dashboard.markup import plain
from jobsight.dashboard.settings import dashboard_settings
from jobsight.dashboard.url_state import Param
from jobsight.dashboard.views.job_health import health_cell
from jobsight.rules import display_text, job_states, links

settings = dashboard_settings()
viewer = viewer_or_stop(settings)

RANGES = {"last 24 hours": dt.timedelta(days=1), "last 7 days": dt.timedelta(days=7),
          "last 30 days": dt.timedelta(days=30), "all time": None}
RANGE_TOKENS = {"1d": "last 24 hours", "7d": "last 7 days", "30d": "last 30 days", "all": "all time"}
STATES = ["any", job_states.RUNNING, *job_states.END_STATES]
# The filters in the address: /jobs?user=bob&state=failed&partition=gpu&range=30d&below=10
# (each left out at its default). ``user`` is an admin's filter only.
FILTERS = [
    Param("state", "jobs_state", "any", url_state.choice(STATES)),
    Param("partition", "jobs_partition", "", str),
    Param("range", "jobs_range", "last 7 days", url_state.token_choice(RANGE_TOKENS),
          url_state.token_text(RANGE_TOKENS)),
    Param("below", "jobs_below", None, url_state.percent, url_state.percent_text),
]


def _text_px(cells: pd.Series) -> int:
    """A text column's width in pixels for its longest cell (about 6.5 pixels a character, with the
    grid's padding): the grid sizes a column by its header and a sample of its rows, which cut a lone
    "▲ straggler" or "idle GPUs, …" among empty cells to the width of the header."""
    longest = max((len(str(c)) for c in cells), default=0)
    return max(50, min(500, round(6.5 * longest) + 24))


if viewer.is_admin:
    FILTERS.insert(0, Param("user", "jobs_user", "", str))
elif "user" in st.query_params:
    del st.query_params["user"]  # an admin's link opened by a user: their own jobs, and the address says so

st.title("Jobs" if viewer.is_admin else f"Jobs of {plain(viewer.name)}")

url_state.restore(FILTERS)
columns = st.columns(5 if viewer.is_admin else 4)
user = None
if viewer.is_admin:
    user = columns.pop(0).text_input("User", key="jobs_user").strip() or None
state = columns[0].selectbox("State", STATES, key="jobs_state",
                             format_func=lambda s: s if s == "any" else job_states.slurm_name(s))
partition = columns[1].text_input("Partition", key="jobs_partition").strip() or None
period = columns[2].selectbox("Time range", list(RANGES), key="jobs_range")
# value=None: the filter may be empty (its state comes from the address, see url_state).
below = columns[3].number_input("Mean GPU util below (%)", min_value=0.0, max_value=100.0, value=None, step=5.0,
                                key="jobs_below", help="Only finished jobs have a mean utilisation.")
url_state.store(FILTERS)

span = RANGES[period]
frame, total = data.jobs(
    viewer, cluster=settings.cluster, user=user, state=None if state == "any" else state, partition=partition,
    since=dt.datetime.now(dt.UTC) - span if span else None, max_mean_util=below,
)

if frame.empty:
    st.info("No jobs match these filters." if total == 0 else "No jobs on this page.")
    st.stop()

# An array's tasks together under it, in task order (dashboard/job_groups.py).
frame = frame.iloc[job_groups.grouped_order(list(frame["job_id"]), list(frame["cluster"]))].reset_index(drop=True)
now = pd.Timestamp.now(tz="UTC")
health = data.open_findings_by_job(viewer, frame)  # one query for the rows shown
rows = frame.to_dict("records")
table = pd.DataFrame({
    "open": [links.job_link(c, j) for c, j in zip(frame["cluster"], frame["job_id"], strict=True)],
    "job": frame["job_id"],
    "array": job_groups.array_cells(list(frame["job_id"]), list(frame["cluster"])),
    # The words of the job's page and of the report (jobsight/rules/display_text.py): a run outside
    # Slurm is its process's owner, a state Slurm's name (its exit code is on the job's page).
    "user": [display_text.user(r) for r in rows],
    "name": frame["name"],
    "partition": [display_text.partition(r) for r in rows],
    "state": [display_text.state(r["state"]) for r in rows],
    "health": [health_cell(health.get((c, j), [])) for c, j in zip(frame["cluster"], frame["job_id"], strict=True)],
    "GPUs": [int(n) if pd.notna(n) else (len(g) if isinstance(g, list) else None)
             for n, g in zip(frame["gpu_count"], frame["gpus"], strict=True)],
    "mean util %": frame["mean_util"],
    # A running job's energy so far, marked as still growing, exactly as its page prints it.
    "energy": [display_text.energy(r["energy_kwh"], growing=r.get("energy_growing") is True or
                                   bool(pd.notna(r.get("energy_growing")) and r.get("energy_growing")))
               for r in rows],
    "flags": [", ".join(map(display_text.flag_label, f)) if isinstance(f, list) else "" for f in frame["flags"]],
    "started": frame["start_time"],
    "elapsed": [display_text.duration(((e if pd.notna(e) else now) - s).total_seconds()) if pd.notna(s) else None
                for s, e in zip(pd.to_datetime(frame["start_time"], utc=True),
                                pd.to_datetime(frame["end_time"], utc=True), strict=True)],
})
st.caption(f"{total} job(s); showing {len(table)}. Running jobs first. Mean utilisation is the whole run "
           "for ended jobs and the last hour for running ones; a running job's energy is so far (≥).")
# A column no row fills (no job of an array in the list) is left out of the view, not of the data. The
# job's id is its link (the "open" column, shown under "job"): the list's thirteen columns reached past
# 1,600 pixels with an "open" column beside the id.
shown = [name for name in table.columns
         if name != "job" and (name != "array" or table["array"].astype(bool).any())]
tables.show(
    table,
    column_order=shown,
    column_config={
        # The id from the link's own query (jobsight/rules/links.py job_query), so the cell reads as "job".
        "open": st.column_config.LinkColumn("job", display_text=r"[?&]job=([^&]*)",
                                            help="the job's id (Slurm's); opens its page"),
        "array": st.column_config.TextColumn(help="a job array's tasks (job ids <array>_<task>), listed together"),
        "health": st.column_config.TextColumn(
            width=_text_px(table["health"]),
            help="open findings: ● critical, ▲ warning, ○ info (details on the job page); ok: none open"),
        "mean util %": st.column_config.NumberColumn(
            "util %", format="%.0f",
            help="mean GPU utilisation; ended jobs: the whole run; running jobs: the last hour"),
        "energy": st.column_config.TextColumn(
            help="the GPUs' energy; ≥: a running job's so far; ≈: integrated from power, no energy counter"),
        "flags": st.column_config.TextColumn(
            width=_text_px(table["flags"]), help="efficiency flags of the job's summary; its page says what to do"),
        # The list's period is days or weeks: the month and day place a job, the year would widen the table.
        "started": st.column_config.DatetimeColumn("start (UTC)", format="MM-DD HH:mm", timezone="UTC"),
        "elapsed": st.column_config.TextColumn(help="days-hours:minutes:seconds, as sacct prints it"),
    },
)
