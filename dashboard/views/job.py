"""One job, live: header, health, waste policies' actions, GPUs, steps, training metrics, timeline
markers, logs, profiles.

The data parts are fragments that rerun on their own every ``refresh_s`` while the job
runs; the log filters and the profile controls stay put.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pandas as pd
import streamlit as st

from jobsight.collector.query.profiles import TooManyOpenRequests
from jobsight.dashboard import charts, data, job_facts
from jobsight.dashboard.identity import viewer_or_stop
from jobsight.dashboard.markup import plain, plain_join
from jobsight.dashboard.settings import dashboard_settings
from jobsight.dashboard.views import job_actions, job_epochs, job_health
from jobsight.protocol import diagnosis
from jobsight.rules import job_states, links

settings = dashboard_settings()
viewer = viewer_or_stop(settings)

# The address: job?cluster=…&job=…&t=… (links.job_link; ``t`` is read by job_health.show).
cluster = st.query_params.get(links.CLUSTER) or settings.cluster or "default"
job_id = st.query_params.get(links.JOB)
if not job_id:
    st.title("Job")
    recent, _ = data.jobs(viewer, cluster=settings.cluster, limit=50)
    if recent.empty:
        st.info("No jobs to show yet.")
        st.stop()
    labels = {f"{r.job_id} · {r.name or ''} · {job_states.slurm_name(str(r.state))}": (r.cluster, r.job_id)
              for r in recent.itertuples()}
    choice = st.selectbox("Open a job", list(labels), index=None, placeholder="choose a job")
    if choice is None:
        st.stop()
    cluster, job_id = labels[choice]
    st.query_params.update(links.job_query(cluster, job_id))

access = data.open_job(viewer, cluster, job_id)
if access.ref is None or access.job is None:
    st.title(f"Job {plain(job_id)}")
    st.error(plain(access.reason))
    st.stop()
ref, first = access.ref, access.job
running = first["state"] == "running"
every = dt.timedelta(seconds=settings.refresh_s) if running else None


def _domain(job: dict[str, Any]) -> charts.Domain:
    now = dt.datetime.now(dt.UTC)
    # A requeued job shows its latest run (collector/jobs/job_runs.py); run_start is NULL for run 0.
    start = job.get("run_start") or job.get("start_time") or job.get("first_seen") or now
    end = job.get("end_time") or (now if job["state"] == "running" else job.get("last_seen")) or now
    return start, max(end, start + dt.timedelta(seconds=1))


def _elapsed(domain: charts.Domain) -> str:
    seconds = int((domain[1] - domain[0]).total_seconds())
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m {seconds % 60:02d}s"


def _state(job: dict[str, Any]) -> str:
    """As Slurm names it (TIMEOUT, OUT_OF_MEMORY), with the exit code or signal when not 0."""
    return (job_states.describe(job["state"], job.get("exit_code")) if job.get("exit_code")
            else job_states.slurm_name(job["state"]))


@st.fragment(run_every=every)
def header() -> None:
    job = data.open_job(viewer, ref.cluster, ref.job_id).job or first
    domain = _domain(job)
    # Every string a job supplied goes through plain(): these elements render Markdown.
    st.title(f"Job {plain(job['job_id'])}" + (f" · {plain(job['name'])}" if job.get("name") else ""))
    if job.get("demo"):
        cluster_name = plain(job.get("cluster") or ref.cluster)
        st.info(f"Demo data: this job was made by `jobsight up --demo` (cluster {cluster_name}); "
                "its GPUs are simulated or it is a small CPU training run, not a real cluster's job.", icon="🧪")
    gpus = job.get("gpus") or []
    cells = st.columns(6)
    cells[0].metric("User", plain(job_facts.user(job)))
    cells[1].metric("Partition", plain(job_facts.partition(job)))
    cells[2].metric("Nodes", job.get("node_count") or len(job.get("nodes") or []) or "unknown")
    cells[3].metric("GPUs", len(gpus) or job.get("gpu_count") or "unknown")
    cells[4].metric("Elapsed", _elapsed(domain))
    state = _state(job)
    cells[5].metric("State", state)
    if job.get("end_reason"):
        # jobsight ended the job (a waste policy): its reason beside Slurm's end state, which only says CANCELLED.
        st.info(f"{plain(state)} — {plain(job['end_reason'])}", icon=":material/block:")
    if job.get("nodes"):
        st.caption("Nodes: " + plain_join(job["nodes"]))
    if job.get("flags"):
        st.warning("Flags: " + ", ".join(job["flags"]))


@st.fragment(run_every=every)
def gpus() -> None:
    st.subheader("GPUs")
    job = data.open_job(viewer, ref.cluster, ref.job_id).job or first
    domain = _domain(job)
    series = data.gpu_series(ref, settings.heatmap_cells, settings.chart_points)
    if series.empty:
        st.info("No GPU samples for this job: no node daemon or in-process sampler has reported yet.")
        return
    frame = charts.gpu_frame(series)
    overlay = charts.marker_layer(data.markers(ref), domain)
    st.altair_chart(charts.gpu_heatmap(frame, domain), width="stretch", height=charts.heatmap_height(frame))
    if note := charts.sampling_note(frame):
        st.caption(note)
    nodes = sorted(frame["node"].dropna().unique())
    shown = st.multiselect("Nodes", nodes, default=nodes[:2], key="job_nodes")
    # Lazy tabs: only the open tab's charts are built and sent; the others are drawn when opened.
    tabs = st.tabs([t for t, _ in charts.GPU_METRICS.values()], key="job_gpu_metric", on_change="rerun")
    for tab, metric in zip(tabs, charts.GPU_METRICS, strict=True):
        if tab.open is False:
            continue
        with tab:
            for node in shown:
                st.altair_chart(charts.gpu_lines(frame, metric, node, domain, overlay, settings.line_points),
                                width="stretch")


@st.fragment(run_every=every)
def training() -> None:
    job = data.open_job(viewer, ref.cluster, ref.job_id).job or first
    domain = _domain(job)
    marks = data.markers(ref)
    overlay = charts.marker_layer(marks, domain)
    st.subheader("Steps")
    steps = data.step_series(ref, settings.heatmap_cells, settings.chart_points)
    if steps.empty:
        st.info("No step timings: the training script has no jobsight callback, or has not finished a step.")
    else:
        view = data.step_view(steps, settings.line_points)
        stragglers = view.stragglers
        if stragglers:
            ratio = diagnosis.DEFAULT_THRESHOLDS.straggler_ratio
            quantity = ("own work per step (data wait + forward; the other ranks wait for it in the all-reduce)"
                        if view.own_work else "mean step time")
            st.warning(f"Straggler rank(s): {', '.join(map(str, stragglers))} — {quantity} at least "
                       f"{ratio:.2f}× the median rank's.")
        st.altair_chart(charts.step_chart(view, domain, overlay), width="stretch")
        if view.band is not None:
            alone = ", ".join(f"{r}" + (" (straggler)" if r in stragglers else "") for r in view.outliers)
            st.caption(f"{view.ranks} ranks: the band is their 10th–90th percentile step time in each bucket, the "
                       f"dark line their median. Drawn alone: {alone or 'none, every rank stays near the band'}"
                       + (f"; {view.hidden} more rank(s) outside the band not drawn." if view.hidden else "."))
        if steps["samples"].notna().any():
            st.altair_chart(charts.throughput_chart(steps, domain), width="stretch")
    st.subheader("Training metrics")
    metrics = data.metric_series(ref, settings.line_points, settings.chart_points)
    if metrics.empty:
        st.info("No training metrics recorded for this job.")
        return
    names = sorted(metrics["name"].unique())
    columns = st.columns(min(3, len(names)))
    for index, name in enumerate(names):
        with columns[index % len(columns)]:
            st.altair_chart(charts.metric_chart(metrics, name, domain, settings.line_points), width="stretch")
    if not marks.empty:
        with st.expander(f"Timeline markers ({len(marks)})"):
            st.dataframe(marks, hide_index=True, width="stretch")


def _int_or_none(text: str) -> int | None:
    return int(text) if text.strip().lstrip("-").isdigit() else None


def log_table() -> None:
    st.subheader("Logs")
    cells = st.columns([1, 1, 1, 1, 3])
    rank = _int_or_none(cells[0].text_input("Rank", key="log_rank"))
    pid = _int_or_none(cells[1].text_input("PID", key="log_pid"))
    tid = _int_or_none(cells[2].text_input("TID", key="log_tid"))
    level = cells[3].selectbox("Level ≥", ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], key="log_level")
    text = cells[4].text_input("Text", key="log_text")
    lines = data.logs(ref, rank=rank, pid=pid, tid=tid, level=level, text=text)
    if lines.empty:
        st.info("No log lines match." if any((rank, pid, tid, text)) or level != "DEBUG" else
                "No log lines: the training script has no jobsight log handler.")
        return
    st.dataframe(lines[["ts", "node", "rank", "pid", "tid", "thread", "level", "logger", "message", "exception"]],
                 hide_index=True, width="stretch", height=320)


# The breakdown's ``<part>_us`` fields and their labels (a comment, not a docstring: Streamlit's magic
# would print a bare string on the page). ``idle`` is the GPU's; a CPU-only profile has ``host_other``
# instead (profile_summary.LEFTOVER), as CPU time outside ops is not idle.
BREAKDOWN_PARTS = {"compute": "compute", "communication": "communication", "memcpy": "memcpy",
                   "data_loading": "data loading", "idle": "GPU idle", "host_other": "other CPU (host) time"}


def _breakdown(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Per rank, seconds by category from the profile's ``breakdown`` (``<part>_us`` fields). A
    host-basis profile stored before ``host_other`` existed says ``idle``: shown as what it was."""
    long = []
    for r in rows:
        times = (r["summary"] or {}).get("breakdown") or {}
        for part, label in BREAKDOWN_PARTS.items():
            value = times.get(f"{part}_us")
            if isinstance(value, int | float):
                if part == "idle" and times.get("basis") == "host":
                    label = BREAKDOWN_PARTS["host_other"]
                long.append({"rank": "?" if r["rank"] is None else r["rank"], "category": label,
                             "seconds": float(value) / 1e6})
    return pd.DataFrame(long)


def _hint(item: Any) -> str:
    if isinstance(item, dict):
        return str(item.get("message") or item.get("hint") or item.get("title") or item.get("rule") or item)
    return str(item)


def profiles() -> None:
    st.subheader("Profiles")
    rows = data.profiles(ref)
    if not rows:
        st.info("No profiles for this job yet." + (" Ask for one below." if running else ""))
    else:
        listing = pd.DataFrame([{
            "profile": r["profile_id"], "recorded": r["ts"], "node": r["node"], "rank": r["rank"],
            "steps": f"{r['step_start']}–{r['step_end']}" if r["step_start"] is not None else "",
            "hints": len(r["diagnosis"] or []) if isinstance(r["diagnosis"], list) else int(bool(r["diagnosis"])),
            "trace KiB": round((r["trace_bytes"] or 0) / 1024, 1)} for r in rows])
        st.dataframe(listing, hide_index=True, width="stretch")
        chosen = st.selectbox("Profile", list(dict.fromkeys(r["profile_id"] for r in rows)), key="profile_id")
        group = [r for r in rows if r["profile_id"] == chosen]
        hints = [_hint(item) for r in group for item in
                 (r["diagnosis"] if isinstance(r["diagnosis"], list) else [r["diagnosis"]] if r["diagnosis"] else [])]
        for hint in dict.fromkeys(hints):
            st.warning(plain(hint), icon=":material/lightbulb:")
        breakdown = _breakdown(group)
        if not breakdown.empty:
            st.altair_chart(charts.breakdown_chart(breakdown), width="stretch")
        by_rank = {f"rank {r['rank']} · {r['node'] or ''}": r for r in group}
        picked = by_rank[st.selectbox("Rank", list(by_rank), key="profile_rank")]
        summary = picked["summary"] or {}
        shown = False
        for key, title in (("ops_by_self_device", "Top ops by self device time"),
                           ("ops_by_self_cpu", "Top ops by self CPU time")):
            if summary.get(key):
                st.caption(title)
                st.dataframe(pd.DataFrame(summary[key]), hide_index=True, width="stretch")
                shown = True
        if not shown:
            st.caption("This profile has no top-ops table.")
        if picked["trace_bytes"]:
            trace = data.profile_trace(ref, int(picked["id"]))
            if trace:
                st.download_button("Download trace (Chrome/Perfetto JSON, gzip)", trace, mime="application/gzip",
                                   file_name=f"{ref.job_id}-{chosen}-rank{picked['rank']}.pt.trace.json.gz")
    if running:
        with st.form("profile_request"):
            st.markdown("**Profile the next N steps**")
            cells = st.columns(2)
            steps = cells[0].number_input("Steps", min_value=1, max_value=1000, value=10, step=1)
            ranks_text = cells[1].text_input("Ranks (comma separated, empty = all)")
            if st.form_submit_button("Request profile"):
                ranks = [int(p) for p in ranks_text.replace(" ", "").split(",") if p.lstrip("-").isdigit()]
                try:
                    request_id = data.request_profile(viewer, ref, int(steps), ranks or None)
                except TooManyOpenRequests as exc:
                    st.error(str(exc))
                else:
                    st.success(f"Profile request {request_id} queued; the job picks it up at its next step.")
    requests = data.profile_requests(ref)
    if not requests.empty:
        st.caption("Profile requests")
        st.dataframe(requests, hide_index=True, width="stretch")


header()
job_health.show(ref, first, running, every)
job_actions.show(ref, every)
gpus()
training()
job_epochs.show(ref, running, every)
log_table()
profiles()
