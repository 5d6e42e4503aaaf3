"""Altair charts for the job page. Each takes the already downsampled frames from
:mod:`jobsight.dashboard.data` and the job's time domain, so every time chart shares one x axis."""

from __future__ import annotations

import datetime as dt

import altair as alt
import pandas as pd

from jobsight.protocol import diagnosis

Domain = tuple[dt.datetime, dt.datetime]

MARKER_COLOURS = alt.Scale(domain=["epoch", "profile", "log warning", "log error", "log critical"],
                           range=["#4c78a8", "#54a24b", "#f58518", "#e45756", "#b00020"])

GPU_METRICS = {
    "util_gpu": ("GPU utilisation (%)", alt.Scale(domain=[0, 100])),
    "mem_used_gib": ("Memory used (GiB)", alt.Scale(zero=True)),
    "power_w": ("Power (W)", alt.Scale(zero=True)),
    "temp_c": ("Temperature (°C)", alt.Scale(zero=False)),
}


def _scale(domain: Domain) -> alt.Scale:
    """A time scale fixed to the job's run, as epoch milliseconds (unambiguous for Vega-Lite)."""
    return alt.Scale(domain=[int(domain[0].timestamp() * 1000), int(domain[1].timestamp() * 1000)])


def _x(domain: Domain, title: str | None = None) -> alt.X:
    return alt.X("bucket:T", title=title, scale=_scale(domain), axis=alt.Axis(format="%H:%M", labelOverlap=True))


def gpu_frame(series: pd.DataFrame) -> pd.DataFrame:
    """Adds a ``gpu`` label (``node:index``) and memory in GiB."""
    frame = series.copy()
    frame["gpu"] = frame["node"].fillna("?").astype(str) + ":" + frame["gpu_index"].astype(str)
    frame["mem_used_gib"] = frame["mem_used"].astype(float) / 2**30
    return frame


def marker_layer(markers: pd.DataFrame, domain: Domain) -> alt.LayerChart | None:
    """Vertical rules for log events and epochs, shaded bands for profiling windows."""
    if markers.empty:
        return None
    scale = _scale(domain)
    base = alt.Chart(markers)
    bands = base.transform_filter(alt.datum.kind == "profile").mark_rect(opacity=0.15).encode(
        x=alt.X("start:T", scale=scale), x2="end:T", color=alt.Color("kind:N", scale=MARKER_COLOURS, title="marker"),
        tooltip=["label:N", "start:T", "end:T"])
    rules = base.transform_filter(alt.datum.kind != "profile").mark_rule(strokeDash=[4, 3]).encode(
        x=alt.X("start:T", scale=scale), color=alt.Color("kind:N", scale=MARKER_COLOURS, title="marker"),
        tooltip=["label:N", "start:T"])
    return alt.layer(bands, rules)


def _with_markers(chart: alt.Chart, markers: pd.DataFrame, domain: Domain) -> alt.LayerChart | alt.Chart:
    """``chart`` with the timeline markers over it; each keeps its own colour scale."""
    layer = marker_layer(markers, domain)
    if layer is None:
        return chart
    return alt.layer(chart, layer).resolve_scale(color="independent").properties(title=chart.title)


def gpu_lines(frame: pd.DataFrame, metric: str, node: str, domain: Domain,
              markers: pd.DataFrame) -> alt.LayerChart | alt.Chart:
    title, scale = GPU_METRICS[metric]
    lines = alt.Chart(frame[frame["node"] == node]).mark_line(interpolate="step-after").encode(
        x=_x(domain), y=alt.Y(f"{metric}:Q", title=title, scale=scale),
        color=alt.Color("gpu:N", title="GPU"), tooltip=["gpu:N", "bucket:T", alt.Tooltip(f"{metric}:Q", format=".1f")],
    ).properties(title=f"{node}: {title}", height=200)
    return _with_markers(lines, markers, domain)


def gpu_heatmap(frame: pd.DataFrame, domain: Domain) -> alt.Chart:
    """GPU × time utilisation. Rows shrink as GPUs grow so 64-512 GPUs stay on one screen;
    y labels are thinned by Vega when rows are too small to label each one."""
    gpus = frame["gpu"].nunique()
    row_px = max(3, min(18, 900 // max(gpus, 1)))
    cells = frame[["gpu", "bucket", "util_gpu"]]  # only what is drawn: a smaller payload
    order = sorted(frame["gpu"].unique(), key=lambda g: (g.rsplit(":", 1)[0], int(g.rsplit(":", 1)[1] or 0)))
    return alt.Chart(cells).mark_rect().encode(
        # One band per time bucket (ordinal): the buckets are already one per pixel column or so.
        x=alt.X("yearmonthdatehoursminutesseconds(bucket):O", title=None,
                axis=alt.Axis(labelOverlap=True, format="%H:%M", labelAngle=0)),
        y=alt.Y("gpu:N", sort=order, title=None, axis=alt.Axis(labelOverlap=True, labelFontSize=9)),
        color=alt.Color("util_gpu:Q", title="util %", scale=alt.Scale(domain=[0, 100], scheme="viridis")),
        tooltip=["gpu:N", "bucket:T", alt.Tooltip("util_gpu:Q", format=".0f")],
    ).properties(height=row_px * gpus, title="GPU utilisation, every GPU")


def heatmap_height(frame: pd.DataFrame) -> int:
    """Pixels for the heatmap including its axis and title (Streamlit needs it explicitly)."""
    gpus = frame["gpu"].nunique()
    return max(3, min(18, 900 // max(gpus, 1))) * gpus + 70


def find_stragglers(steps: pd.DataFrame) -> list[int]:
    """Straggler ranks by the one rule of :func:`jobsight.protocol.diagnosis.stragglers`, over each
    rank's mean step time in the shown range."""
    if steps.empty or steps["rank"].nunique() < 2:
        return []
    weighted = steps.assign(total=steps["duration_s"] * steps["steps"]).groupby("rank")[["total", "steps"]].sum()
    per_rank = weighted["total"] / weighted["steps"]
    return sorted(diagnosis.stragglers({int(rank): float(value) for rank, value in per_rank.items()}))


def step_chart(steps: pd.DataFrame, stragglers: list[int], domain: Domain,
               markers: pd.DataFrame) -> alt.LayerChart | alt.Chart:
    frame = steps.assign(rank=steps["rank"].fillna(-1).astype(int),
                         straggler=steps["rank"].isin(stragglers).map({True: "straggler", False: "ok"}))
    lines = alt.Chart(frame).mark_line().encode(
        x=_x(domain), y=alt.Y("duration_s:Q", title="step time (s)"), detail="rank:N",
        color=alt.Color("straggler:N", scale=alt.Scale(domain=["ok", "straggler"], range=["#9ecae9", "#e45756"]),
                        title=None),
        strokeWidth=alt.condition(alt.datum.straggler == "straggler", alt.value(2.5), alt.value(1)),
        tooltip=["rank:N", "bucket:T", alt.Tooltip("duration_s:Q", format=".3f"), "last_step:Q"],
    ).properties(height=220, title="Step time per rank")
    return _with_markers(lines, markers, domain)


def metric_chart(frame: pd.DataFrame, name: str, domain: Domain) -> alt.Chart:
    data = frame[frame["name"] == name].assign(rank=lambda f: f["rank"].fillna(-1).astype(int))
    return alt.Chart(data).mark_line().encode(
        x=alt.X("bucket:T", title=None, axis=alt.Axis(format="%H:%M", labelOverlap=True)),
        y=alt.Y("value:Q", title=name, scale=alt.Scale(zero=False)),
        color=alt.Color("rank:N"),
        tooltip=["rank:N", "bucket:T", "step:Q", alt.Tooltip("value:Q", format=".4g")],
    ).properties(height=180, title=name)


def breakdown_chart(breakdown: pd.DataFrame) -> alt.Chart:
    """Stacked bars: one per rank, one colour per category (compute, communication, ...)."""
    return alt.Chart(breakdown).mark_bar().encode(
        x=alt.X("seconds:Q", title="time (s)", stack="zero"), y=alt.Y("rank:N"),
        color=alt.Color("category:N"), tooltip=["rank:N", "category:N", alt.Tooltip("seconds:Q", format=".3f")],
    ).properties(title="Per-rank breakdown")


def trend_chart(trend: pd.DataFrame) -> alt.Chart:
    long = trend.melt(id_vars=["day"], value_vars=["gpu_hours", "low_util_gpu_hours"], var_name="series",
                      value_name="hours")
    return alt.Chart(long).mark_line(point=True).encode(
        x=alt.X("day:T", title=None), y=alt.Y("hours:Q", title="GPU-hours"), color="series:N",
        tooltip=["day:T", "series:N", alt.Tooltip("hours:Q", format=".1f")])

