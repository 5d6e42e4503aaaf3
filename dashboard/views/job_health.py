"""The job page's health section, and how a finding reads wherever the dashboard shows one.

On the job page: a banner of the job's open findings (most severe first; critical as an error,
warning as a warning, info as a note), each with its evidence and a link to its moment in the
timeline; the resolved ones in a collapsed "History". The link opens the job page with ``t``
(:data:`MOMENT_PARAM`, see :mod:`jobsight.rules.links`) set, and the page then scrolls to a
view of every GPU and rank over the minutes around that moment, marked with a red rule
(:func:`show` draws that too), while the charts further down keep the whole run.

Not a page of its own: :mod:`jobsight.dashboard.views.job` calls :func:`show`; the jobs list and
the Attention page use :func:`health_cell`, :func:`mark` and :func:`moment_url`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

import altair as alt
import pandas as pd
import streamlit as st

from jobsight.collector.query.grids import points_per_series
from jobsight.dashboard import charts, data, tables, vega
from jobsight.dashboard.markup import plain
from jobsight.dashboard.settings import dashboard_settings
from jobsight.rules import display_text, links
from jobsight.rules.rule_names import HUNG_RANK, IDLE_ALLOCATION, LOW_UTILISATION, MEMORY_UNUSED, STRAGGLER

JOB_PAGE: Final = "views/job.py"
"""The job page as ``st.page_link`` names it (relative to the app's main script)."""
MOMENT_PARAM: Final = links.MOMENT
"""The job page's query parameter holding the moment to show (ISO 8601, UTC)."""
MOMENT_ANCHOR: Final = "moment"
"""The id of the window's heading, which the page scrolls to."""
_SCROLLED: Final = "_job_moment_scrolled"
"""Session state: the ``t`` the page last scrolled to, so that a rerun leaves the reader's scrolling alone."""
# Scrolls the window's heading to the top of the view. The page is still growing below it when this
# runs (the charts come later), and a short page cannot scroll that far yet: it tries again as the
# page grows, for a few seconds, and stops as soon as the reader scrolls, clicks or types.
_SCROLL_SCRIPT: Final = """<script>
(() => {
  const EVENTS = ["wheel", "touchstart", "keydown", "mousedown"];
  let tries = 0;
  let timer = 0;
  const stop = () => { clearInterval(timer); for (const e of EVENTS) window.removeEventListener(e, stop, true); };
  timer = setInterval(() => {
    const target = document.getElementById("ANCHOR");
    if (++tries > 60) { stop(); return; }
    if (!target) return;
    target.style.scrollMarginTop = "4rem";
    if (Math.abs(target.getBoundingClientRect().top - 64) > 8) target.scrollIntoView({block: "start"});
  }, 250);
  for (const e of EVENTS) window.addEventListener(e, stop, true);
})();
</script>""".replace("ANCHOR", MOMENT_ANCHOR)
MOMENT_BEFORE: Final = dt.timedelta(minutes=10)
MOMENT_AFTER: Final = dt.timedelta(minutes=10)
"""The window shown around a moment: a hung rank's moment is its last step, so what led up to it
and the silence after both matter."""
MOMENT_POINTS: Final = 120
"""Time buckets a GPU or rank gets in the window (5 s over 20 minutes), fewer for big jobs."""

SEVERITY_ORDER: Final = ("critical", "warning", "info")
SEVERITY_MARK: Final = {"critical": "●", "warning": "▲", "info": "○"}
_BOX: Final[Mapping[str, tuple[Callable[..., Any], str]]] = {
    "critical": (st.error, ":material/error:"),
    "warning": (st.warning, ":material/warning:"),
    "info": (st.info, ":material/info:"),
}
RULE_LABEL: Final = {HUNG_RANK: "hung", STRAGGLER: "straggler", IDLE_ALLOCATION: "idle GPUs",
                     LOW_UTILISATION: "low util", MEMORY_UNUSED: "memory unused"}
"""Short names of the rules of :mod:`jobsight.rules.health` for table cells."""


def mark(finding: Mapping[str, Any]) -> str:
    """``● hung``: the finding's severity mark and its rule's short name."""
    return f"{SEVERITY_MARK.get(finding['severity'], '○')} {RULE_LABEL.get(finding['rule'], finding['rule'])}"


def health_cell(open_findings: list[dict[str, Any]]) -> str:
    """A job's cell in the jobs list: its open findings' marks, most severe first; ``ok`` when none
    is open."""
    return ", ".join(dict.fromkeys(mark(f) for f in open_findings)) or "ok"


def moment_of(finding: Mapping[str, Any]) -> dt.datetime:
    """The moment a finding points at (:func:`jobsight.rules.links.finding_moment`)."""
    at = finding.get("at_ts")
    # A row of a data frame holds NaT for a missing time, and NaT is truthy.
    moment = links.finding_moment(None if at is None or pd.isna(at) else at, finding["opened_at"])
    assert moment is not None  # every finding has opened_at
    return moment


def moment_url(cluster: str, job_id: str, moment: dt.datetime) -> str:
    """A relative link (as the jobs list's) to the job page at ``moment``."""
    return links.job_link(cluster, job_id, moment)


def _value_text(key: str, value: Any) -> str:
    # Rules store times as seconds since the epoch (``last_step_at``): shown as the page's clock.
    if key.endswith("_at") and isinstance(value, int | float) and not isinstance(value, bool):
        return dt.datetime.fromtimestamp(value, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list | tuple):
        return ", ".join(map(str, value))
    return display_text.text(value)


def _flatten(evidence: Mapping[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    for key, value in evidence.items():
        if isinstance(value, Mapping):
            yield from _flatten(value, (*path, str(key)))
        else:
            yield display_text.key_path((*path, str(key))), _value_text(str(key), value)


def evidence_table(evidence: Mapping[str, Any] | None) -> pd.DataFrame:
    """The evidence as ``name``/``value`` rows, each name the path of its keys in words (``ranks.1.silent_s``
    reads ``rank 1 › silent (s)``, :func:`display_text.key_path`)."""
    return pd.DataFrame(list(_flatten(evidence or {})), columns=["name", "value"])


def _where(finding: Mapping[str, Any]) -> str:
    parts = [f"node {plain(finding['node'])}" if finding.get("node") else "",
             f"GPU {plain(finding['gpu'])}" if finding.get("gpu") else ""]
    return ", ".join(p for p in parts if p)


def _finding(ref: data.JobRef, finding: Mapping[str, Any]) -> None:
    box, icon = _BOX.get(finding["severity"], _BOX["info"])
    where = _where(finding)
    # Markdown: the title and message name the job's nodes and GPUs, so they are plain() text.
    box(f"**{plain(finding['title'])}**" + (f" ({where})" if where else "") + f"  \n{plain(finding['message'])}  \n"
        f"Open since {finding['opened_at'].astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC, last checked "
        f"{finding['updated_at'].astimezone(dt.UTC):%H:%M:%S} UTC.", icon=icon)
    moment = moment_of(finding)
    left, right = st.columns([1, 2])
    left.page_link(JOB_PAGE, label=f"Show {moment:%H:%M:%S} UTC in the timeline", icon=":material/timeline:",
                   query_params=links.job_query(ref.cluster, ref.job_id, moment))
    # Drawn when opened (a rerun of the banner), not with the page: a table is one of the costliest
    # things a browser draws, and most readers never open it (docs/scale.md).
    evidence = right.expander("Evidence", key=evidence_key(finding), on_change="rerun")
    if evidence.open:
        with evidence:
            tables.show(evidence_table(finding["evidence"]))


def evidence_key(finding: Mapping[str, Any]) -> str:
    """The widget key of a finding's "Evidence" expander: its state (open or not) is the session's."""
    return f"health_evidence_{finding['id']}"


_TIME = st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm:ss", timezone="UTC")


HISTORY_KEY: Final = "health_history"
"""The widget key of the "History" expander (open or not, as :func:`evidence_key`'s)."""


def _history(resolved: list[dict[str, Any]]) -> None:
    history = st.expander(f"History: {len(resolved)} resolved finding(s)", key=HISTORY_KEY, on_change="rerun")
    if not history.open:
        return
    with history:
        tables.show(pd.DataFrame({
            "health": [mark(f) for f in resolved], "subject": [f["subject"] or "job" for f in resolved],
            "title": [f["title"] for f in resolved], "opened (UTC)": [f["opened_at"] for f in resolved],
            "resolved (UTC)": [f["resolved_at"] for f in resolved], "message": [f["message"] for f in resolved],
        }), column_config={"opened (UTC)": _TIME, "resolved (UTC)": _TIME})


def _banner(ref: data.JobRef) -> None:
    found = data.findings(ref)
    opened = sorted((f for f in found if f["state"] == "open"),
                    key=lambda f: SEVERITY_ORDER.index(f["severity"]) if f["severity"] in SEVERITY_ORDER else 9)
    for finding in opened:
        _finding(ref, finding)
    resolved = [f for f in found if f["state"] != "open"]
    if resolved:
        _history(resolved)


def _window(job: Mapping[str, Any], moment: dt.datetime) -> charts.Domain:
    """Around ``moment``, within the run where it is known (a running job's end is now)."""
    start, end = moment - MOMENT_BEFORE, moment + MOMENT_AFTER
    if job.get("start_time"):
        start = max(start, job["start_time"])
    last = job.get("end_time") or (dt.datetime.now(dt.UTC) if job.get("state") == "running" else None)
    if last is not None:
        end = min(end, last)
    return start, max(end, start + dt.timedelta(minutes=1))


def _moment(ref: data.JobRef, job: Mapping[str, Any], moment: dt.datetime, text: str) -> None:
    settings = dashboard_settings()
    domain = _window(job, moment)
    st.subheader(f"Around {moment:%Y-%m-%d %H:%M:%S} UTC", anchor=MOMENT_ANCHOR)
    # Always this one slot, filled only once per moment: the elements below keep their places on reruns.
    scroll = st.empty()
    if st.session_state.get(_SCROLLED) != text:
        st.session_state[_SCROLLED] = text
        scroll.html(_SCROLL_SCRIPT, unsafe_allow_javascript=True)
    st.caption(f"Every GPU and rank from {domain[0]:%H:%M:%S} to {domain[1]:%H:%M:%S} UTC; the red line marks "
               "the moment the page was opened at. The charts further down show the whole run.")
    series = len(job.get("gpus") or []) or int(job.get("gpu_count") or 0) or 1
    gpus, steps = data.moment(ref, domain[0], domain[1], points_per_series(settings.heatmap_cells, series,
                                                                           MOMENT_POINTS))
    rule = alt.Chart(pd.DataFrame({"at": [pd.Timestamp(moment)]})).mark_rule(color="#e45756", strokeWidth=2).encode(
        x=charts.time_x(domain, "at"), tooltip=[charts.time_tooltip("at", "moment")])
    if not gpus.empty:
        frame = charts.gpu_frame(gpus)
        vega.show(vega.Layers([charts.gpu_heatmap(frame, domain), rule]), charts.heatmap_height(frame))
    if not steps.empty:
        view = data.step_view(steps, settings.line_points)
        vega.show(charts.step_chart(view, domain, vega.Layers([rule])), charts.step_chart_px(view, None))
    if gpus.empty and steps.empty:
        st.info("No GPU samples or steps of this job around this moment.")
    st.page_link(JOB_PAGE, label="Hide this window", icon=":material/close:",
                 query_params=links.job_query(ref.cluster, ref.job_id))


def show(ref: data.JobRef, job: Mapping[str, Any], running: bool, every: dt.timedelta | None) -> None:
    """The banner, redrawn every ``every`` while the job runs (``None``: drawn once), then the
    window around the moment the page was opened at (``t``), scrolled to, if a link named one."""
    st.fragment(_banner, run_every=every)(ref)
    text = st.query_params.get(MOMENT_PARAM)
    moment = links.parse_moment(text)
    if moment is not None and text is not None:
        _moment(ref, job, moment, text)
        return
    st.session_state.pop(_SCROLLED, None)
    if text:
        st.caption(f"The link's moment {plain(repr(text))} is not a time; showing the whole run.")
