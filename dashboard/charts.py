"""Altair charts for the job page. Each takes the already downsampled frames from
:mod:`jobsight.dashboard.data` and the job's time domain, so every time chart shares one x axis. The
step chart draws the view the data layer returns (:class:`~jobsight.collector.query.rank_outliers.StepView`:
the band, the stragglers and the ranks outside the band, worked out in the query room).

What a chart ships to the browser is bounded: the heatmap by the cells the data layer read, a line
chart by a point budget across its lines (neighbouring buckets merged when over it), and the step
chart of many ranks is a band across ranks plus the few ranks outside it, not a line per rank.

GPU charts are true to time at any sampling interval: the query never cuts buckets narrower than the
samples come (``bucket_s``), heatmap cells span their buckets on the time axis, and a GPU's line joins
buckets up to :data:`JOIN_BUCKETS` widths apart and breaks at longer gaps, the outages.

Every time axis and time tooltip comes from :func:`time_x` and :func:`time_tooltip`: one format
(24-hour) in one zone (UTC), named in the axis title, so no chart reads another's clock differently."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from typing import Final

import altair as alt
import pandas as pd

from jobsight.collector.query.bucket_merge import merge_buckets
from jobsight.collector.query.grids import MIN_SERIES_POINTS, points_per_series
from jobsight.collector.query.rank_outliers import BAND_QUANTILES, StepView
from jobsight.dashboard import heatmap_picture, vega

Domain = tuple[dt.datetime, dt.datetime]

MARKER_COLOURS = alt.Scale(domain=["epoch", "profile", "log warning", "log error", "log critical", "xid"],
                           range=["#4c78a8", "#54a24b", "#f58518", "#e45756", "#b00020", "#7b3294"])

GPU_METRICS = {
    "util_gpu": ("GPU utilisation (%)", alt.Scale(domain=[0, 100])),
    "mem_used_gib": ("Memory used (GiB)", alt.Scale(zero=True)),
    "power_w": ("Power (W)", alt.Scale(zero=True)),
    "temp_c": ("Temperature (°C)", alt.Scale(zero=False)),
}


TIME_ZONE: Final = "UTC"
"""The zone of every time axis and tooltip. Vega-Lite's default is the browser's zone, which made a
chart drawn by Streamlit's own line chart read 06:35 where the others read 18:35; UTC is what the
collector stores, the API returns and Slurm's accounting is compared against."""
TIME_FORMAT: Final = "%H:%M"
"""24-hour clock on every time axis."""
SHORT_TIME_FORMAT: Final = "%H:%M:%S"
"""The same with seconds, for a domain under :data:`SHORT_DOMAIN`: Vega ticks it every 30 s or less,
which minutes alone labelled 08:40, 08:40, 08:41, 08:41."""
SHORT_DOMAIN: Final = dt.timedelta(minutes=20)
DAYS_TIME_FORMAT: Final = "%b %d %H:%M"
"""The same with the day, for a domain of :data:`DATED_DOMAIN` or more that crosses midnight (UTC): a
13-hour axis read 22:00 … 00:00 … 11:00 with nothing to say which day each hour was on."""
DATED_DOMAIN: Final = dt.timedelta(hours=1)
"""A shorter domain keeps its short labels across midnight: its few ticks are minutes apart, and its
tooltips carry the date."""
TIME_TITLE: Final = f"time ({TIME_ZONE})"
_TOOLTIP_FORMAT: Final = "%Y-%m-%d %H:%M:%S"


def _scale(domain: Domain | None) -> alt.Scale:
    """A UTC time scale, fixed to the job's run when ``domain`` is given (ISO 8601 in UTC with its
    ``Z``; epoch milliseconds drew some charts squeezed against the left edge in Chromium, the
    time labels gone); ``None``: fitted to the data."""
    if domain is None:
        return alt.Scale(type="utc")
    return alt.Scale(type="utc", domain=[d.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ") for d in domain])


def time_x(domain: Domain | None, field: str = "bucket", *, title: str = TIME_TITLE,
           time_format: str | None = None) -> alt.X:
    """The time axis every chart shares: ``field`` on a UTC scale, labelled in 24-hour UTC (with
    seconds over a short domain) and titled with the zone, so two charts of the page always read the
    same clock."""
    if time_format is None:
        time_format = axis_format(domain)
    # labelBound: a tick near the domain's end put its label half past the chart's right edge, cut (the
    # demo's throughput chart, when its last tick fell a few seconds before now); Vega hides it instead.
    return alt.X(f"{field}:T", title=title, scale=_scale(domain),
                 axis=alt.Axis(format=time_format, labelOverlap=True, labelBound=True))


def axis_format(domain: Domain | None) -> str:
    """The time axis' format for ``domain``: with the day when it crosses a UTC midnight and is
    :data:`DATED_DOMAIN` or longer (:data:`DAYS_TIME_FORMAT`), with seconds when under
    :data:`SHORT_DOMAIN`, else hours and minutes; ``None`` (fitted to the data): hours and minutes."""
    if domain is None:
        return TIME_FORMAT
    days = domain[0].astimezone(dt.UTC).date() != domain[1].astimezone(dt.UTC).date()
    if days and domain[1] - domain[0] >= DATED_DOMAIN:
        return DAYS_TIME_FORMAT
    return SHORT_TIME_FORMAT if domain[1] - domain[0] < SHORT_DOMAIN else TIME_FORMAT


def time_tooltip(field: str = "bucket", title: str = "time") -> alt.Tooltip:
    """A time in a tooltip, in the axes' zone: formatted by Vega's ``utcFormat``, which takes a date or
    epoch milliseconds alike. No time unit: Vega-Lite computes a time unit for every row as the chart
    is drawn, and it needs each row's time parsed into a date first (:func:`vega.as_sent` skips that)."""
    return alt.Tooltip(field, type="temporal", format=_TOOLTIP_FORMAT, formatType="utc", title=f"{title} ({TIME_ZONE})")


def fit_lines(frame: pd.DataFrame, by: Sequence[str], budget: int, how: Mapping[str, str]) -> pd.DataFrame:
    """``frame`` with at most ``budget`` points over all its series (see :func:`merge_buckets`)."""
    if frame.empty:
        return frame
    series = frame.groupby(list(by), dropna=False).ngroups
    return merge_buckets(frame, by, points_per_series(budget, series, budget), how)


JOIN_BUCKETS: Final = 3
"""A line joins a series' buckets up to this many bucket widths apart (up to two empty buckets between:
a late or lost sample or two); farther apart is an outage, drawn as a gap in the line. Buckets are never
narrower than the sampling interval, so an outage is at least this many intervals without a sample."""


def bucket_width(frame: pd.DataFrame) -> pd.Timedelta | None:
    """The width of ``frame``'s buckets: the query's ``bucket_s``; for rows without it, the smallest step
    between bucket starts (buckets share one grid, ``date_bin`` from one origin); ``None`` for one bucket."""
    if "bucket_s" in frame and frame["bucket_s"].notna().any():
        return pd.Timedelta(microseconds=round(float(frame["bucket_s"].max()) * 1e6))  # date_bin's precision
    steps = frame["bucket"].drop_duplicates().sort_values().diff().dropna()
    steps = steps[steps > pd.Timedelta(0)]
    return None if steps.empty else pd.Timedelta(steps.min())


def merge_on_grid(frame: pd.DataFrame, by: Sequence[str], width: pd.Timedelta, factor: int,
                  how: Mapping[str, str]) -> pd.DataFrame:
    """``frame`` with every ``factor`` buckets of its grid (``width`` apart, from its first bucket)
    merged into one that starts where the first of them does. By time, not by count: buckets on
    either side of an outage are never merged into one."""
    if factor <= 1:
        return frame
    first, wide = frame["bucket"].min(), width * factor
    merged = frame.assign(bucket=first + (frame["bucket"] - first) // wide * wide)
    return merged.groupby([*by, "bucket"], as_index=False, sort=True, dropna=False).agg(dict(how))


def line_rows(frame: pd.DataFrame, by: Sequence[str], value: str, width: pd.Timedelta) -> pd.DataFrame:
    """``frame``'s series (named by ``by``) as a step line draws them true to time, with a ``point``
    column: ``bucket`` for the buckets; ``end``, after each run of buckets closer than
    :data:`JOIN_BUCKETS` widths, at its last bucket's end with that bucket's value (a step line ends at
    its last point, so without it the last bucket would not be drawn across its width, and a lone bucket
    would be an invisible one-point path); ``gap``, with no value, halfway across an outage, where Vega
    breaks the line."""
    ordered = frame.sort_values([*by, "bucket"], kind="stable").reset_index(drop=True)
    series = ordered.groupby(list(by), sort=False, dropna=False).ngroup()
    new_series = series.ne(series.shift())
    outage = ordered["bucket"].diff() > width * JOIN_BUCKETS
    run = (new_series | outage).cumsum()
    last = run.ne(run.shift(-1))
    ends = ordered[last].assign(bucket=lambda f: f["bucket"] + width, point="end")
    followed = last & ~new_series.shift(-1, fill_value=True)
    gaps = ordered[followed].assign(
        bucket=ordered.loc[followed, "bucket"] + width
        + (ordered["bucket"].shift(-1)[followed] - ordered.loc[followed, "bucket"] - width) / 2,
        point="gap")
    gaps[value] = float("nan")
    rows = pd.concat([ordered.assign(point="bucket"), ends, gaps], ignore_index=True)
    return rows.sort_values([*by, "bucket"], kind="stable").reset_index(drop=True)


def fit_line_rows(frame: pd.DataFrame, by: Sequence[str], value: str, width: pd.Timedelta | None, budget: int,
                  how: Mapping[str, str]) -> pd.DataFrame:
    """:func:`line_rows` of ``frame`` within ``budget`` rows, neighbouring buckets merged on their grid
    (:func:`merge_on_grid`) as far as needed, but never to fewer than
    :data:`~jobsight.collector.query.grids.MIN_SERIES_POINTS` a series (a very large job goes over instead)."""
    if frame.empty or width is None:
        return frame.assign(point="bucket")
    series = frame.groupby(list(by), dropna=False).ngroups
    slots = int((frame["bucket"].max() - frame["bucket"].min()) / width) + 1
    # One row a series is its closing ``end``: the buckets get the rest.
    factor = max(1, math.ceil(slots / max(points_per_series(budget, series, budget) - 1, 1)))
    while True:
        rows = line_rows(merge_on_grid(frame, by, width, factor, how), by, value, width * factor)
        if len(rows) <= budget or math.ceil(slots / (factor + 1)) < MIN_SERIES_POINTS:
            return rows
        factor += 1


def gpu_frame(series: pd.DataFrame) -> pd.DataFrame:
    """Adds a ``gpu`` label (``node:index``) and memory in GiB (where ``series`` has memory)."""
    frame = series.copy()
    frame["gpu"] = frame["node"].fillna("?").astype(str) + ":" + frame["gpu_index"].astype(str)
    if "mem_used" in frame:
        frame["mem_used_gib"] = frame["mem_used"].astype(float) / 2**30
    return frame


MAX_EPOCH_RULES: Final = 12
"""Most epoch rules drawn over a chart. A job of 88 short epochs drew 88 dashed lines, a wall that
hid the steps under it; past this many, epochs are thinned to evenly spaced ones (the first and
the last always among them). The markers table under the charts still lists every epoch."""


def thin_epochs(markers: pd.DataFrame, most: int = MAX_EPOCH_RULES) -> pd.DataFrame:
    """``markers`` with at most ``most`` epoch markers, evenly chosen in time order and keeping the
    first and the last; other markers are untouched."""
    is_epoch = markers["kind"] == "epoch"
    epochs = markers[is_epoch].sort_values("start", kind="stable")
    if len(epochs) <= most:
        return markers
    last = len(epochs) - 1
    picked = sorted({round(i * last / (most - 1)) for i in range(most)}) if most > 1 else [last]
    return pd.concat([markers[~is_epoch], epochs.iloc[picked]])


def _within(markers: pd.DataFrame, domain: Domain) -> pd.DataFrame:
    """The markers that start or end in ``domain``, or span it."""
    if markers.empty:
        return markers
    ends, starts = pd.to_datetime(markers["end"], utc=True), pd.to_datetime(markers["start"], utc=True)
    return markers[(ends >= pd.Timestamp(domain[0])) & (starts <= pd.Timestamp(domain[1]))]


def marker_layer(markers: pd.DataFrame, domain: Domain) -> alt.LayerChart | None:
    """Vertical rules for log events and epochs (thinned, :func:`thin_epochs`), shaded bands for
    profiling windows: those of ``domain`` (the page's time window), ``None`` when none is."""
    inside = _within(markers, domain)
    if inside.empty:
        return None
    base = alt.Chart(thin_epochs(inside))
    bands = base.transform_filter(alt.datum.kind == "profile").mark_rect(opacity=0.15, clip=True).encode(
        x=time_x(domain, "start"), x2=alt.X2("end"),
        color=alt.Color("kind:N", scale=MARKER_COLOURS, title="marker"),
        tooltip=[alt.Tooltip("label:N"), time_tooltip("start", "start"), time_tooltip("end", "end")])
    rules = base.transform_filter(alt.datum.kind != "profile").mark_rule(strokeDash=[4, 3], clip=True).encode(
        x=time_x(domain, "start"), color=alt.Color("kind:N", scale=MARKER_COLOURS, title="marker"),
        tooltip=[alt.Tooltip("label:N"), time_tooltip("start")])
    return vega.Layers([bands, rules])  # no parameters to merge (vega.Layers)


def _with_markers(chart: alt.Chart | alt.LayerChart, overlay: alt.LayerChart | None) -> alt.LayerChart | alt.Chart:
    """``chart`` with the timeline markers (:func:`marker_layer`) over it; each keeps its own colour
    scale. The page builds the overlay once per refresh: Altair takes tens of milliseconds to build
    one, and every time chart of the page carries it."""
    if overlay is None:
        return chart
    return vega.Layers([chart, overlay], title=chart.title,
                       resolve=alt.Resolve(scale=alt.ScaleResolveMap(color="independent")))


CHART_FRAME_PX: Final = 110
"""What a time chart takes around its plot: title, time axis labels and title, padding. Streamlit fits
the whole chart into the height it is given (its own height when none is), so a chart given only its
plot's height had its plot squashed: the throughput chart's 160 pixels left a strip some 10 pixels tall,
its axis labels drawn over each other, and legends were cut (6 of a node's 8 GPUs)."""
SUBTITLE_PX: Final = 20
LEGEND_ROW_PX: Final = 20
"""A legend entry (Vega's 10-pixel symbol beside a label in Streamlit's font, and the row padding)."""
MARKER_ROW_PX: Final = 30
"""An entry of the markers' legend, which draws a band's square and a dashed rule's stroke in one (measured
in Chromium)."""
LEGEND_TITLE_PX: Final = 24
LEGEND_GAP_PX: Final = 18
"""Between two legends of one chart (Vega's legend offset)."""
LEGEND_MOST: Final = 24
"""Most entries a series legend lists; past them its title says which it lists ("first 24 of 72")."""
MIN_PLOT_PX: Final = 120
"""The least height of a time chart's plot: room for four y labels that do not overlap."""
LINE_PLOT_PX: Final = 200
STEP_PLOT_PX: Final = 220
METRIC_PLOT_PX: Final = 180
THROUGHPUT_PLOT_PX: Final = 160


def element_px(plot_px: int, legends: Sequence[int] = (), *, subtitle: bool = False) -> int:
    """Pixels to give ``st.altair_chart`` for a chart whose plot should be ``plot_px`` tall (at least
    :data:`MIN_PLOT_PX`), with legends of ``legends`` pixels each (:func:`legend_px`) beside it: enough
    for the plot with its title and axis, and for every legend entry."""
    frame = CHART_FRAME_PX + (SUBTITLE_PX if subtitle else 0)
    shown = [px for px in legends if px > 0]
    legend = sum(shown) + LEGEND_GAP_PX * max(len(shown) - 1, 0)
    return max(max(plot_px, MIN_PLOT_PX) + frame, legend + frame // 2)


def legend_px(entries: int, row_px: int = LEGEND_ROW_PX) -> int:
    """Pixels of a legend of ``entries`` (at most :data:`LEGEND_MOST` listed), with its title; 0 for none."""
    return LEGEND_TITLE_PX + min(entries, LEGEND_MOST) * row_px if entries > 0 else 0


def series_legend(title: str, count: int) -> alt.Legend:
    """A legend that lists all ``count`` series (Vega's default stops at 30), or the first
    :data:`LEGEND_MOST` with a title that says so."""
    if count <= LEGEND_MOST:
        return alt.Legend(title=title, symbolLimit=max(count, 1))
    return alt.Legend(title=f"{title} (first {LEGEND_MOST} of {count})", symbolLimit=LEGEND_MOST)


def _marker_legend(overlay: alt.LayerChart | None) -> list[int]:
    """The markers' legend in pixels: every kind of :data:`MARKER_COLOURS` (its domain is fixed)."""
    return [] if overlay is None else [legend_px(len(MARKER_COLOURS.domain), MARKER_ROW_PX)]


def gpu_line_rows(frame: pd.DataFrame, metric: str, node: str, budget: int) -> pd.DataFrame:
    """What one node's line chart of ``metric`` draws (:func:`fit_line_rows`): ``gpu``, ``bucket``,
    ``point`` and the metric, within ``budget`` rows."""
    # Memory is the bucket's maximum in the query: merged buckets keep the maximum too.
    merge = "max" if metric == "mem_used_gib" else "mean"
    mine = frame.loc[frame["node"] == node, ["gpu", "bucket", metric]]
    return fit_line_rows(mine, ["gpu"], metric, bucket_width(frame), budget, {metric: merge})


def gpu_lines(frame: pd.DataFrame, metric: str, node: str, domain: Domain, overlay: alt.LayerChart | None,
              budget: int) -> alt.LayerChart | alt.Chart:
    """One node's GPUs, a line each, within ``budget`` points for the chart, broken at outages."""
    title, scale = GPU_METRICS[metric]
    shown = gpu_line_rows(frame, metric, node, budget)
    # Vega-Lite's default, named because the outages' gaps rest on it: a path breaks at a row with no value.
    lines = alt.Chart(vega.as_sent(shown)).mark_line(interpolate="step-after", clip=True,
                                       invalid="break-paths-show-path-domains").encode(
        x=time_x(domain), y=alt.Y(f"{metric}:Q", title=title, scale=scale),
        color=alt.Color("gpu:N", legend=series_legend("GPU", shown["gpu"].nunique())),
        tooltip=["gpu:N", time_tooltip(), alt.Tooltip(f"{metric}:Q", format=".1f")],
    ).properties(title=f"{node}: {title}", height=LINE_PLOT_PX)
    return _with_markers(lines, overlay)


def gpu_lines_px(frame: pd.DataFrame, node: str, overlay: alt.LayerChart | None) -> int:
    """The element height of :func:`gpu_lines` of ``node`` (:func:`element_px`)."""
    gpus = frame.loc[frame["node"] == node, "gpu"].nunique()
    return element_px(LINE_PLOT_PX, [legend_px(gpus), *_marker_legend(overlay)])


def gpu_heatmap(frame: pd.DataFrame, domain: Domain) -> alt.LayerChart:
    """GPU × time utilisation, one cell per GPU and bucket as the data layer read them (within the
    heatmap's cell budget), drawn as one picture (:mod:`jobsight.dashboard.heatmap_picture`) that spans the
    cells' time on the page's one time axis and the plot's height, a row a GPU. Rows shrink as GPUs grow
    so 64-512 GPUs stay on one screen; y labels are thinned by Vega when rows are too small to label
    each one.

    Over the picture, one invisible row a GPU answers the pointer with that GPU's mean and its lowest
    bucket (:func:`row_tips`): a tooltip a row, not a cell, because a Vega item a cell is what the
    picture saves. Each bucket's own value is in the node's lines (the Details' Nodes). The colour
    legend is Vega's, from a scale the picture's colours are taken from."""
    cells = frame[["gpu", "bucket", "util_gpu"]]
    width = bucket_width(frame)
    if width is None:  # one bucket a GPU, its width not said: it runs to the end of the domain
        width = max(pd.Timestamp(domain[1]) - cells["bucket"].min(), pd.Timedelta(seconds=1))
    order = sorted(frame["gpu"].unique(), key=lambda g: (g.rsplit(":", 1)[0], int(g.rsplit(":", 1)[1] or 0)))
    drawn = heatmap_picture.picture(cells, width, order)
    y = alt.Y("gpu:N", scale=alt.Scale(domain=order), title=None, axis=alt.Axis(labelOverlap=True, labelFontSize=9))
    # Channels as Altair's objects: given as plain values, Altair resolves each against every alternative
    # of the schema, some milliseconds a channel on every page load.
    x, x2 = time_x(domain, "start"), alt.X2("end")
    image = pd.DataFrame({"start": [drawn.start], "end": [drawn.end], "buckets": [drawn.buckets], "url": [drawn.url]})
    picture = alt.Chart(vega.as_sent(image)).mark_image(
        clip=True, aspect=False, aria=False, smooth=drawn.smooth).encode(
        x=x, x2=x2, y=_PLOT_TOP, y2=_PLOT_BOTTOM, url=alt.Url("url", type="nominal"))
    rows = pd.DataFrame({"gpu": order, "start": drawn.start, "end": drawn.end, "tip": row_tips(cells, order)})
    hover = alt.Chart(vega.as_sent(rows)).mark_rect(
        clip=True, opacity=0, aria=False, tooltip=alt.ExprRef(expr="datum.tip")).encode(x=x, x2=x2, y=y)
    # Two cells of no width: they give the colour scale the picture is coloured by, and so its legend.
    ends = pd.DataFrame({"gpu": order[0], "start": drawn.start, "util_gpu": list(heatmap_picture.UTILISATION_DOMAIN)})
    utilisation = alt.Scale(domain=list(heatmap_picture.UTILISATION_DOMAIN), scheme="viridis")
    legend = alt.Chart(vega.as_sent(ends)).mark_rect(aria=False).encode(
        x=x, x2=alt.X2("start"), y=y, color=alt.Color("util_gpu:Q", title="util %", scale=utilisation))
    return vega.Layers([picture, hover, legend], height=_heatmap_px(len(order)), title="GPU utilisation, every GPU")


# The plot's top and bottom edges (Vega-Lite's "height"), for the picture that spans every GPU's row.
# Altair declares these two channels' classes without types.
_PLOT_TOP: Final = alt.YValue(0)  # type: ignore[no-untyped-call]
_PLOT_BOTTOM: Final = alt.Y2Value("height")  # type: ignore[no-untyped-call]


def row_tips(cells: pd.DataFrame, gpus: Sequence[str]) -> list[str]:
    """Each heatmap row's tooltip: ``n01:3 · mean 71 % · lowest 4 % at 2026-11-27 23:07:31 UTC``."""
    values = cells.dropna(subset=["util_gpu"])
    lowest = values.loc[values.groupby("gpu")["util_gpu"].idxmin()].set_index("gpu")
    lowest = lowest.assign(mean=values.groupby("gpu")["util_gpu"].mean(),
                           at=pd.to_datetime(lowest["bucket"], utc=True).dt.strftime(_TOOLTIP_FORMAT))
    lowest = lowest.reindex(list(gpus))
    return [f"{gpu} · no value" if pd.isna(row.mean)
            else f"{gpu} · mean {row.mean:.0f} % · lowest {row.util_gpu:.0f} % at {row.at} {TIME_ZONE}"
            for gpu, row in zip(gpus, lowest.itertuples(index=False), strict=True)]


def _duration(seconds: float) -> str:
    """``15 s``, ``1.5 s``, ``2 min``, ``2.5 h``: a bucket's or an interval's length, as people say it."""
    for unit, size in (("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.3g} s"


def sampling_note(frame: pd.DataFrame) -> str | None:
    """The GPU charts' time resolution in words (the sampling interval the query found, the buckets'
    width, what a gap means); ``None`` when the rows do not say (a frame without ``bucket_s``)."""
    width = bucket_width(frame) if "bucket_s" in frame else None
    if width is None:
        return None
    interval = frame["interval_s"].dropna() if "interval_s" in frame else pd.Series(dtype=float)
    sampled = f"GPUs sampled every {_duration(float(interval.max()))}; " if not interval.empty else ""
    return (f"{sampled}each cell and point is a {_duration(width.total_seconds())} bucket; a line breaks where no "
            f"sample came for {JOIN_BUCKETS} buckets or more.")


HEATMAP_MIN_PX: Final = 90
"""The least height of the heatmap's cells: the colour legend beside them needs about this much (Vega
draws its gradient at least 64 pixels long, under its title), and Streamlit fits the whole chart into
the height it is given, so two GPUs' 36 pixels of rows were squeezed to a sliver under the legend."""


def _heatmap_px(gpus: int) -> int:
    """Pixels of the heatmap's rows: 18 a GPU, fewer as GPUs grow (so 64-512 stay on one screen), at
    least 3 a GPU and :data:`HEATMAP_MIN_PX` in all."""
    return max(HEATMAP_MIN_PX, max(3, min(18, 900 // max(gpus, 1))) * gpus)


HEATMAP_FRAME_PX: Final = 120
"""What the heatmap takes around its rows: title, time axis, padding (118 pixels, measured in Chromium).
Streamlit fits the whole chart into the height it is given, so this much more than the rows keeps them at
:func:`_heatmap_px`: 70 more left 16 GPUs' 288 pixels of rows at 241."""


def heatmap_height(frame: pd.DataFrame) -> int:
    """Pixels for the heatmap including its axis and title (Streamlit needs it explicitly)."""
    return _heatmap_px(frame["gpu"].nunique()) + HEATMAP_FRAME_PX


_STRAGGLER_COLOURS = alt.Scale(domain=["ok", "straggler"], range=["#9ecae9", "#e45756"])
_OTHER_OUTLIER_COLOURS = ("#f58518", "#54a24b", "#b279a2", "#9d755d", "#eeca3b", "#ff9da6", "#72b7b2", "#4c78a8")


def _straggler_width(width: float) -> alt.StrokeWidthValue:
    """A straggler's line 2.5 pixels wide, the others' ``width``. Channels are built as Altair's objects,
    not as shorthand strings or dicts, which Altair turns into objects through the schema (half of the
    step chart's build time)."""
    return alt.StrokeWidthValue(width, condition={"test": "datum.straggler === 'straggler'", "value": 2.5})


def _outlier_label(rank: int, stragglers: Sequence[int]) -> str:
    return f"rank {rank}" + (" (straggler)" if rank in stragglers else "")


def _outlier_colours(view: StepView) -> alt.Scale:
    """Stragglers red, as in the per-rank chart; the other ranks drawn alone in colours that are
    neither red nor the band's blue, in the order they are listed."""
    others = iter(_OTHER_OUTLIER_COLOURS)
    labels = [_outlier_label(r, view.stragglers) for r in view.outliers]
    colours = ["#e45756" if r in view.stragglers else next(others) for r in view.outliers]
    return alt.Scale(domain=labels, range=colours)


OWN_WORK_TITLE: Final = "own work per step (s)"
"""Data wait + forward: the work a rank does before it meets the others in the all-reduce."""


def _labelled(view: StepView) -> pd.DataFrame:
    return view.lines.assign(
        straggler=view.lines["rank"].isin(view.stragglers).map({True: "straggler", False: "ok"}),
        label=view.lines["rank"].map(lambda r: _outlier_label(r, view.stragglers)))


def _band_layers(band: pd.DataFrame, domain: Domain, y_title: str) -> list[alt.Chart]:
    """The band (10th–90th percentile across ranks, :data:`BAND_QUANTILES`) and its median line."""
    low, high = (round(q * 100) for q in BAND_QUANTILES)
    base = alt.Chart(vega.as_sent(band)).encode(x=time_x(domain))
    band_tooltip = [time_tooltip(), alt.Tooltip("median:Q", format=".3f"),
                    alt.Tooltip("low:Q", format=".3f", title=f"p{low}"),
                    alt.Tooltip("high:Q", format=".3f", title=f"p{high}"), alt.Tooltip("ranks:Q")]
    area = base.mark_area(opacity=0.35, color="#9ecae9", interpolate="step-after").encode(
        y=alt.Y("low:Q", title=y_title), y2=alt.Y2("high"), tooltip=band_tooltip)
    median = base.mark_line(color="#3182bd", interpolate="step-after").encode(
        y=alt.Y("median:Q", title=y_title), tooltip=band_tooltip)
    return [area, median]


def _outlier_lines(view: StepView, lines: pd.DataFrame, field: str, domain: Domain, y_title: str) -> alt.Chart:
    """The ranks drawn alone, a layer of their own over the band: stragglers red and thicker."""
    drawn = vega.as_sent(lines[["rank", "bucket", field, "label", "straggler", "last_step"]])
    chart: alt.Chart = alt.Chart(drawn).mark_line(interpolate="step-after").encode(
        x=time_x(domain), y=alt.Y(f"{field}:Q", title=y_title), detail=alt.Detail("rank:N"),
        color=alt.Color("label:N", title="drawn alone", scale=_outlier_colours(view)),
        strokeWidth=_straggler_width(1.5),
        tooltip=[alt.Tooltip("rank:N"), time_tooltip(), alt.Tooltip(f"{field}:Q", format=".3f"),
                 alt.Tooltip("last_step:Q")])
    return chart


def _per_rank(view: StepView, field: str, domain: Domain, y_title: str, title: str | alt.TitleParams,
              plot_px: int) -> alt.Chart:
    """Few ranks: a line per rank of ``field``, stragglers red."""
    # What the chart draws and tells, no more: a 2-rank job's recent window is 1,800 rows, and the
    # browser turns each cell sent into a value.
    lines = vega.as_sent(_labelled(view).dropna(subset=[field])[["rank", "bucket", field, "straggler", "last_step"]])
    chart: alt.Chart = alt.Chart(lines).mark_line().encode(
        x=time_x(domain), y=alt.Y(f"{field}:Q", title=y_title), detail=alt.Detail("rank:N"),
        color=alt.Color("straggler:N", scale=_STRAGGLER_COLOURS, title=None),
        strokeWidth=_straggler_width(1),
        tooltip=[alt.Tooltip("rank:N"), time_tooltip(), alt.Tooltip(f"{field}:Q", format=".3f"),
                 alt.Tooltip("last_step:Q")],
    ).properties(height=plot_px, title=title)
    return chart


def step_chart(view: StepView, domain: Domain, overlay: alt.LayerChart | None) -> alt.LayerChart | alt.Chart:
    """Few ranks: a line per rank, stragglers red. Many: the band (10th–90th percentile across
    ranks) with its median, and the outlier ranks as lines over it. Where the stragglers were found
    on own work per step, the subtitle says why the straggler's step time lies on the band: the
    others wait for it (:func:`own_work_chart` draws what sets it apart)."""
    waits = "every rank waits for the slowest in the all-reduce, so step times are alike"
    if view.band is None:
        title: str | alt.TitleParams = (alt.TitleParams("Step time per rank", subtitle=waits) if view.own_work
                                        else "Step time per rank")
        return _with_markers(_per_rank(view, "duration_s", domain, "step time (s)", title, STEP_PLOT_PX), overlay)
    # Every layer names the shared y axis the same, so Vega-Lite does not list each field in its title.
    y_title = "step time (s)"
    low, high = (round(q * 100) for q in BAND_QUANTILES)
    layers = _band_layers(view.band, domain, y_title)
    lines = _labelled(view)
    if not lines.empty:
        layers.append(_outlier_lines(view, lines, "duration_s", domain, y_title))
    subtitle = f"band: {low}th–{high}th percentile per bucket; dark line: median; lines: ranks outside the band"
    title = alt.TitleParams(f"Step time across {view.ranks} ranks",
                            subtitle=[subtitle, waits] if view.own_work else subtitle)
    chart = vega.Layers(layers, height=STEP_PLOT_PX, title=title)
    return _with_markers(chart, overlay)


def own_work_chart(view: StepView, domain: Domain,
                   overlay: alt.LayerChart | None) -> alt.LayerChart | alt.Chart | None:
    """Own work per step (data wait + forward), the figure the straggler rule compares in synchronous
    training: the straggler's line apart from the others', whose step times it sets. Many ranks: the
    band of own work across ranks and its median, the ranks drawn alone as lines over it (stragglers
    red); few: a line per rank. ``None`` when the steps did not measure it (:attr:`StepView.own_work`)."""
    if not view.own_work:
        return None
    if view.own_band is None:
        chart = _per_rank(view, "own_s", domain, OWN_WORK_TITLE, "Own work per step per rank (data wait + forward)",
                          STEP_PLOT_PX)
        return _with_markers(chart, overlay)
    layers = _band_layers(view.own_band, domain, OWN_WORK_TITLE)
    lines = _labelled(view).dropna(subset=["own_s"]) if "own_s" in view.lines else pd.DataFrame()
    if not lines.empty:
        layers.append(_outlier_lines(view, lines, "own_s", domain, OWN_WORK_TITLE))
    low, high = (round(q * 100) for q in BAND_QUANTILES)
    title = alt.TitleParams(f"Own work per step across {view.ranks} ranks (data wait + forward)",
                            subtitle=f"band: {low}th–{high}th percentile per bucket; dark line: median; "
                                     "lines: the ranks drawn alone above, stragglers red")
    return _with_markers(vega.Layers(layers, height=STEP_PLOT_PX, title=title), overlay)


def step_chart_px(view: StepView, overlay: alt.LayerChart | None) -> int:
    """The element height of :func:`step_chart` or :func:`own_work_chart` of ``view`` (:func:`element_px`)."""
    entries = 2 if view.band is None else len(view.outliers)  # ok/straggler, or the ranks drawn alone
    subtitles = view.band is not None or view.own_work
    px = element_px(STEP_PLOT_PX, [legend_px(entries), *_marker_legend(overlay)], subtitle=subtitles)
    return px + (SUBTITLE_PX if view.band is not None and view.own_work else 0)  # two subtitle lines


def metric_chart(frame: pd.DataFrame, name: str, domain: Domain, budget: int) -> alt.Chart:
    """One metric, a line per rank that logs it, within ``budget`` points for the chart."""
    data = frame.loc[frame["name"] == name, ["rank", "bucket", "step", "value"]].assign(
        rank=lambda f: f["rank"].fillna(-1).astype(int))
    data = fit_lines(data, ["rank"], budget, {"value": "mean", "step": "max"})
    chart: alt.Chart = alt.Chart(vega.as_sent(data)).mark_line().encode(
        x=time_x(domain), y=alt.Y("value:Q", title=name, scale=alt.Scale(zero=False)),
        color=alt.Color("rank:N", legend=series_legend("rank", data["rank"].nunique())),
        tooltip=["rank:N", time_tooltip(), "step:Q", alt.Tooltip("value:Q", format=".4g")],
    ).properties(height=METRIC_PLOT_PX, title=name)
    return chart


def metric_chart_px(frame: pd.DataFrame, name: str) -> int:
    """The element height of :func:`metric_chart` of ``name`` (:func:`element_px`)."""
    return element_px(METRIC_PLOT_PX, [legend_px(frame.loc[frame["name"] == name, "rank"].nunique())])


THROUGHPUT_FIELD: Final = "samples_per_s"
THROUGHPUT_MIN_STEPS: Final = 20
"""Steps a rank takes in a throughput bucket, at least: neighbouring buckets are merged until they hold
this many. Buckets of one or two steps each drew a comb between half and all of the rate (16 ranks
stepping every second in 1.8 s buckets: 284 and 568 samples/s for 512)."""


def throughput_rows(steps: pd.DataFrame) -> pd.DataFrame:
    """Per bucket, the samples all ranks trained on per second (``samples_per_s``): the bucket's samples
    over the time it spans, so the figure does not change with the zoom as a count per bucket did.
    Buckets (:func:`bucket_width` wide) are merged on their grid to hold :data:`THROUGHPUT_MIN_STEPS`
    steps a rank; the last spans to the last bucket's end only. Empty when the width is not known (a
    single bucket)."""
    measured = steps.dropna(subset=["samples"])
    width = bucket_width(steps)
    if width is None or measured.empty:
        return pd.DataFrame({"bucket": pd.Series(dtype="datetime64[ns, UTC]"), "samples": pd.Series(dtype=float),
                             THROUGHPUT_FIELD: pd.Series(dtype=float)})
    per_bucket = measured.groupby("bucket", as_index=False)[["samples", "steps"]].sum()
    steps_a_rank = float(per_bucket["steps"].sum()) / max(measured["rank"].nunique(), 1) / len(per_bucket)
    factor = max(1, math.ceil(THROUGHPUT_MIN_STEPS / max(steps_a_rank, 1e-9)))
    merged = merge_on_grid(per_bucket, [], width, factor, {"samples": "sum", "steps": "sum"})
    last_end = per_bucket["bucket"].max() + width
    spans = (last_end - merged["bucket"]).clip(upper=width * factor).dt.total_seconds()
    return merged.assign(**{THROUGHPUT_FIELD: merged["samples"].astype(float) / spans})


def throughput_chart(steps: pd.DataFrame, domain: Domain) -> alt.Chart:
    """Samples per second summed over ranks (:func:`throughput_rows`), on the page's one time axis, its
    axis in SI units (``50k``) from zero."""
    rows = throughput_rows(steps)
    chart: alt.Chart = alt.Chart(vega.as_sent(rows)).mark_line(interpolate="step-after").encode(
        x=time_x(domain),
        y=alt.Y(f"{THROUGHPUT_FIELD}:Q", title="samples/s", scale=alt.Scale(zero=True),
                axis=alt.Axis(format="~s", tickCount=4)),
        tooltip=[time_tooltip(), alt.Tooltip(f"{THROUGHPUT_FIELD}:Q", format=",.1f", title="samples/s"),
                 alt.Tooltip("samples:Q", format=",.0f", title="samples in the bucket")],
    ).properties(height=THROUGHPUT_PLOT_PX, title="Throughput (samples/s, all ranks)")
    return chart


def throughput_px() -> int:
    """The element height of :func:`throughput_chart` (:func:`element_px`)."""
    return element_px(THROUGHPUT_PLOT_PX)


def breakdown_chart(breakdown: pd.DataFrame) -> alt.Chart:
    """Stacked bars: one per rank, one colour per category (compute, communication, ...)."""
    chart: alt.Chart = alt.Chart(breakdown).mark_bar().encode(
        x=alt.X("seconds:Q", title="time (s)", stack="zero"), y=alt.Y("rank:N"),
        color=alt.Color("category:N"), tooltip=["rank:N", "category:N", alt.Tooltip("seconds:Q", format=".3f")],
    ).properties(title="Per-rank breakdown")
    return chart


BAR_PX: Final = 24
"""A rank's bar in the breakdown, with the gap to the next."""


def breakdown_px(breakdown: pd.DataFrame) -> int:
    """The element height of :func:`breakdown_chart`: a bar a rank, and every category in its legend
    (a chart of one rank was too short for it and dropped its largest part's name)."""
    return element_px(BAR_PX * breakdown["rank"].nunique(), [legend_px(breakdown["category"].nunique())])


TREND_SERIES: Final = {"gpu_hours": "GPU-hours", "low_util_gpu_hours": "low-util GPU-hours"}
"""The audit trend's lines and the words their legend and tooltip give them (the table's headers; Vega
cuts a legend's label past 160 pixels: "GPU-hours at low utilisat…")."""


def trend_chart(trend: pd.DataFrame) -> alt.Chart:
    """The audit's daily GPU-hours, all and at low utilisation: a day a point, on a UTC day axis."""
    # Floats: PostgreSQL's numeric sums arrive as Decimal, which Arrow hands Vega as a scaled
    # BigInt it cannot plot (the chart stayed blank).
    hours = trend.astype({name: float for name in TREND_SERIES})
    long = hours.melt(id_vars=["day"], value_vars=list(TREND_SERIES), var_name="series", value_name="hours")
    long = long.assign(series=long["series"].map(TREND_SERIES),
                       date=pd.to_datetime(long["day"], utc=True).dt.strftime("%Y-%m-%d"))
    # A tick a day at most: ticks every 12 hours labelled by their day read 2026-11-22, 2026-11-22, …
    x = time_x(None, "day", title=f"day ({TIME_ZONE})", time_format="%Y-%m-%d")
    x = x.axis(format="%Y-%m-%d", labelOverlap=True, tickCount={"interval": "day", "step": 1})
    chart: alt.Chart = alt.Chart(long).mark_line(point=True).encode(
        x=x,
        y=alt.Y("hours:Q", title="GPU-hours"), color=alt.Color("series:N", title=None),
        tooltip=[alt.Tooltip("date:N", title=f"day ({TIME_ZONE})"), alt.Tooltip("series:N", title="what"),
                 alt.Tooltip("hours:Q", format=".2f", title="GPU-hours")])
    return chart
