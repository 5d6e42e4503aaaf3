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
from jobsight.collector.query.series import UTILISATION
from jobsight.dashboard import charts, data, job_details, tables, time_window, url_state, vega
from jobsight.dashboard.identity import viewer_or_stop
from jobsight.dashboard.markup import plain, plain_join
from jobsight.dashboard.settings import dashboard_settings
from jobsight.dashboard.views import job_actions, job_epochs, job_health
from jobsight.protocol import diagnosis
from jobsight.rules import display_text, links

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
    labels = {f"{r.job_id} · {display_text.text(r.name)} · {display_text.state(str(r.state))}": (r.cluster, r.job_id)
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
    return display_text.duration((domain[1] - domain[0]).total_seconds())


def _state(job: dict[str, Any]) -> str:
    """As Slurm names it (TIMEOUT, OUT_OF_MEMORY), with the exit code or signal when not 0."""
    return display_text.state(job["state"], job.get("exit_code"))


def _gpu_hours(job: dict[str, Any], domain: charts.Domain, gpus: int) -> str:
    """The summary's GPU-hours (the report's figure); before there is one, the allocated GPUs over the
    run so far (the audit's rule), marked as still growing while the job runs."""
    if job.get("gpu_hours") is not None:
        return display_text.gpu_hours(job["gpu_hours"])
    if not gpus:
        return display_text.MISSING
    hours = gpus * (domain[1] - domain[0]).total_seconds() / 3600
    return display_text.gpu_hours(hours, growing=job["state"] == "running")


def _advice(job: dict[str, Any]) -> None:
    """Each efficiency flag of the job's summary as what to do about it, the report's words."""
    thresholds = (job.get("summary") or {}).get("thresholds") if isinstance(job.get("summary"), dict) else None
    for flag in job.get("flags") or []:
        st.warning(f"**{display_text.flag_label(flag).capitalize()}.** "
                   + plain(display_text.flag_advice(flag, thresholds)), icon=":material/lightbulb:")


def _job() -> dict[str, Any]:
    """The job as it is now (a fragment's rerun reads it again), else as the page first read it."""
    return data.open_job(viewer, ref.cluster, ref.job_id).job or first


FACTS_HELP = ("Elapsed: days-hours:minutes:seconds, as sacct prints it. GPU-hours: allocated GPUs × time; "
              "≥: still growing.")


def _facts_table(facts: dict[str, Any]) -> str:
    """The header's facts as one Markdown table, a label over each value: one element on the page where
    seven ``st.metric`` in columns were 21 (each a column, its block and the metric), the cost the
    browser pays for every element when it draws the page (docs/scale.md). Every value goes through
    :func:`plain`, which escapes ``|`` too: a value cannot end its cell."""
    return "\n".join(("| " + " | ".join(plain(label) for label in facts) + " |",
                      "|" + " --- |" * len(facts),
                      "| " + " | ".join(plain(value) for value in facts.values()) + " |"))


@st.fragment(run_every=every)
def header() -> None:
    job = _job()
    domain = _domain(job)
    # Every string a job supplied goes through plain(): these elements render Markdown.
    st.title(f"Job {plain(job['job_id'])}" + (f" · {plain(job['name'])}" if job.get("name") else ""))
    if job.get("demo"):
        cluster_name = plain(job.get("cluster") or ref.cluster)
        st.info(f"Demo data: this job was made by `jobsight up --demo` (cluster {cluster_name}); "
                "its GPUs are simulated or it is a small CPU training run, not a real cluster's job.", icon="🧪")
    gpus = job.get("gpus") or []
    state = _state(job)
    st.markdown(_facts_table({
        "User": display_text.user(job), "Partition": display_text.partition(job),
        "Nodes": job.get("node_count") or len(job.get("nodes") or []) or display_text.UNKNOWN,
        "GPUs": len(gpus) or job.get("gpu_count") or display_text.UNKNOWN, "Elapsed": _elapsed(domain),
        "GPU-hours": _gpu_hours(job, domain, len(gpus) or int(job.get("gpu_count") or 0)), "State": state}),
        help=FACTS_HELP)
    if job.get("end_reason"):
        # jobsight ended the job (a waste policy): its reason beside Slurm's end state, which only says CANCELLED.
        st.info(f"{plain(state)} — {plain(job['end_reason'])}", icon=":material/block:")
    if job.get("nodes"):
        st.caption("Nodes: " + plain_join(job["nodes"]))
    _advice(job)


@st.fragment(run_every=every)
def gpus(span: dt.timedelta | None) -> None:
    """The GPUs over the chosen window (``span``: its last minutes or hours, ``None``: the whole run)."""
    st.subheader("GPUs")
    series = data.gpu_series(ref, settings.heatmap_cells, settings.chart_points, span, measures=UTILISATION)
    if series.empty:
        st.info("No GPU samples for this job: no node daemon or in-process sampler has reported yet.")
        return
    frame = charts.gpu_frame(series)
    vega.show(charts.gpu_heatmap(frame, time_window.clip(_domain(_job()), span)), charts.heatmap_height(frame))
    if note := charts.sampling_note(frame):
        st.caption(note)


@st.fragment(run_every=every)
def node_lines(span: dt.timedelta | None) -> None:
    """Each chosen node's GPUs, a line each, of one metric (utilisation, memory, power, temperature)."""
    series = data.gpu_series(ref, settings.heatmap_cells, settings.chart_points, span)
    if series.empty:
        st.info("No GPU samples for this job: no node daemon or in-process sampler has reported yet.")
        return
    frame = charts.gpu_frame(series)
    domain = time_window.clip(_domain(_job()), span)
    overlay = charts.marker_layer(data.markers(ref), domain)
    nodes = sorted(frame["node"].dropna().unique())
    shown = st.multiselect("Nodes", nodes, default=nodes[:2], key="job_nodes")
    # Lazy tabs: only the open tab's charts are built and sent; the others are drawn when opened.
    tabs = st.tabs([t for t, _ in charts.GPU_METRICS.values()], key="job_gpu_metric", on_change="rerun")
    for tab, metric in zip(tabs, charts.GPU_METRICS, strict=True):
        if tab.open is False:
            continue
        with tab:
            for node in shown:
                vega.show(charts.gpu_lines(frame, metric, node, domain, overlay, settings.line_points),
                          charts.gpu_lines_px(frame, node, overlay))


@st.fragment(run_every=every)
def training(span: dt.timedelta | None) -> None:
    """Steps and throughput over the chosen window (as :func:`gpus`)."""
    job = _job()
    domain = time_window.clip(_domain(job), span)
    marks = data.markers(ref)
    overlay = charts.marker_layer(marks, domain)
    st.subheader("Steps")
    steps = data.step_series(ref, settings.heatmap_cells, settings.chart_points, span)
    if steps.empty:
        st.info("No step timings: the training script has no jobsight callback, or has not finished a step.")
    else:
        view = data.step_view(steps, settings.line_points)
        stragglers = view.stragglers
        if stragglers:
            ratio = diagnosis.DEFAULT_THRESHOLDS.straggler_ratio
            quantity = ("own work per step (data wait + forward; the other ranks wait for it in the all-reduce)"
                        if view.own_work else "mean step time")
            st.warning(f"Straggler rank(s): {', '.join(map(display_text.rank, stragglers))} — {quantity} at least "
                       f"{ratio:.2f}× the median rank's.")
        vega.show(charts.step_chart(view, domain, overlay), charts.step_chart_px(view, overlay))
        if (own := charts.own_work_chart(view, domain, overlay)) is not None:
            vega.show(own, charts.step_chart_px(view, overlay))
        if view.band is not None:
            alone = ", ".join(display_text.rank(r) + (" (straggler)" if r in stragglers else "") for r in view.outliers)
            st.caption(f"{view.ranks} ranks: the band is their 10th–90th percentile step time in each bucket, the "
                       f"dark line their median. Drawn alone: {alone or 'none, every rank stays near the band'}"
                       + (f"; {view.hidden} more rank(s) outside the band not drawn." if view.hidden else "."))
        if steps["samples"].notna().any():
            vega.show(charts.throughput_chart(steps, domain), charts.throughput_px())


@st.fragment(run_every=every)
def training_metrics(span: dt.timedelta | None) -> None:
    """The training metrics over the chosen window (as :func:`gpus`), and the timeline's markers."""
    job = _job()
    domain = time_window.clip(_domain(job), span)
    marks = data.markers(ref)
    metrics = data.metric_series(ref, settings.line_points, settings.chart_points, span)
    if metrics.empty:
        st.info("No training metrics recorded for this job.")
    else:
        names = sorted(metrics["name"].unique())
        columns = st.columns(min(3, len(names)))
        for index, name in enumerate(names):
            with columns[index % len(columns)]:
                vega.show(charts.metric_chart(metrics, name, domain, settings.line_points),
                          charts.metric_chart_px(metrics, name))
    if not marks.empty:
        with st.expander(f"Timeline markers ({len(marks)})"):
            tables.show(marks, column_config=_TIMES)


_TIMES = {name: st.column_config.DatetimeColumn(f"{name} (UTC)", format="YYYY-MM-DD HH:mm:ss", timezone="UTC")
          for name in ("start", "end")}


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
    shown = lines[["ts", "node", "rank", "pid", "tid", "thread", "level", "logger", "message", "exception"]]
    tables.show(shown.assign(rank=[display_text.rank(r) for r in shown["rank"]]), height=320,
                column_config={"ts": st.column_config.DatetimeColumn("time (UTC)", format="YYYY-MM-DD HH:mm:ss.SSS",
                                                                     timezone="UTC")})


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
                long.append({"rank": display_text.rank(r["rank"]), "category": label,
                             "seconds": float(value) / 1e6})
    return pd.DataFrame(long)


def _hint(item: Any) -> str:
    if isinstance(item, dict):
        return str(item.get("message") or item.get("hint") or item.get("title") or item.get("rule") or item)
    return str(item)


def _ops(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """A top-ops table as a reader sees it: memory as sizes (an op's negative self memory is what it
    freed, never a negative size) and input shapes as text."""
    frame = pd.DataFrame(rows)
    for column in ("cpu_memory_bytes", "device_memory_bytes"):
        if column in frame:
            frame[column] = [display_text.memory(v) for v in frame[column]]
    if "input_shapes" in frame:
        frame["input_shapes"] = ["; ".join(map(str, v)) if isinstance(v, list) else display_text.text(v)
                                 for v in frame["input_shapes"]]
    return frame


def profiles() -> None:
    st.subheader("Profiles")
    rows = data.profiles(ref)
    if not rows:
        st.info("No profiles for this job yet." + (" Ask for one below." if running else ""))
    else:
        listing = pd.DataFrame([{
            "profile": r["profile_id"], "recorded": r["ts"], "node": r["node"], "rank": display_text.rank(r["rank"]),
            "steps": f"{r['step_start']}–{r['step_end']}" if r["step_start"] is not None else "",
            "hints": len(r["diagnosis"] or []) if isinstance(r["diagnosis"], list) else int(bool(r["diagnosis"])),
            "trace KiB": round((r["trace_bytes"] or 0) / 1024, 1)} for r in rows])
        tables.show(listing, column_config={"recorded": _TIMES["start"]})
        chosen = st.selectbox("Profile", list(dict.fromkeys(r["profile_id"] for r in rows)), key="profile_id")
        group = [r for r in rows if r["profile_id"] == chosen]
        hints = [_hint(item) for r in group for item in
                 (r["diagnosis"] if isinstance(r["diagnosis"], list) else [r["diagnosis"]] if r["diagnosis"] else [])]
        for hint in dict.fromkeys(hints):
            st.warning(plain(hint), icon=":material/lightbulb:")
        breakdown = _breakdown(group)
        if not breakdown.empty:
            vega.show(charts.breakdown_chart(breakdown), charts.breakdown_px(breakdown))
        by_rank = {f"{display_text.rank_label(r['rank'])} · {display_text.text(r['node'])}": r for r in group}
        picked = by_rank[st.selectbox("Rank", list(by_rank), key="profile_rank")]
        summary = picked["summary"] or {}
        shown = False
        for key, title in (("ops_by_self_device", "Top ops by self device time"),
                           ("ops_by_self_cpu", "Top ops by self CPU time")):
            if summary.get(key):
                st.caption(title)
                tables.show(_ops(summary[key]))
                shown = True
        if not shown:
            st.caption("This profile has no top-ops table.")
        if picked["trace_bytes"]:
            trace = data.profile_trace(ref, int(picked["id"]))
            if trace:
                rank = display_text.rank(picked["rank"]).replace(" ", "-")
                st.download_button("Download trace (Chrome/Perfetto JSON, gzip)", trace, mime="application/gzip",
                                   file_name=f"{ref.job_id}-{chosen}-rank{rank}.pt.trace.json.gz")
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
        tables.show(requests)


header()
job_health.show(ref, first, running, every)
job_actions.show(ref, every)
window = time_window.param(running)
details = job_details.param()
url_state.restore([window, details])
st.radio("Time window", list(time_window.SPANS), key=time_window.KEY, horizontal=True,
         help="The recent window is drawn at the sampling's own resolution; longer ones from the per-minute "
              "and per-hour rollups.")
span = time_window.span(st.session_state.get(time_window.KEY))
gpus(span)
training(span)
# The details, one at a time and none until chosen (jobsight.dashboard.job_details).
st.radio("Details", list(job_details.SECTIONS), key=job_details.KEY, horizontal=True,
         help="One at a time, drawn when chosen: the page opens on what a job is judged by, its health, GPUs "
              "and steps.")
url_state.store([window, details])
shown = st.session_state.get(job_details.KEY)
if shown == job_details.NODES:
    node_lines(span)
elif shown == job_details.METRICS:
    training_metrics(span)
elif shown == job_details.ENERGY:
    job_epochs.show(ref, running, every)
elif shown == job_details.LOGS:
    log_table()
elif shown == job_details.PROFILES:
    profiles()
