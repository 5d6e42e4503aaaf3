"""What the job page ships to the browser stays within its budgets, however many GPUs and ranks.

On a seeded running 64-GPU job (8 nodes × 8 GPUs, a rank per GPU, 30 minutes at 1 Hz): the
heatmap's cells stay within ``heatmap_cells``, a line chart's points within ``line_points``, and
the step chart of many ranks is a band plus the outlier ranks only (the rule's straggler and the
rank that stalled), while a job of few ranks keeps a line per rank.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import altair as alt
import pandas as pd
import psycopg
import pyarrow as pa
import pytest
from psycopg.rows import dict_row
from streamlit.testing.v1 import AppTest

from jobsight.collector.query import rank_outliers
from jobsight.collector.query import series as queries
from jobsight.collector.query.grids import (
    MIN_SERIES_POINTS,
    RAW_ROWS_MAX,
    points_per_series,
    read_gpu_grid,
    read_metric_grid,
    read_step_grid,
    rollup_points,
)
from jobsight.collector.query.time_range import TimeRange
from jobsight.dashboard import charts
from jobsight.dashboard.settings import load_dashboard_settings
from tests.dashboard import drawn_heatmap
from tests.dashboard.conftest import texts
from tests.dashboard.seed import BigJob, Seed


@pytest.fixture
def conn(database_url: str) -> Any:
    with psycopg.connect(database_url, row_factory=dict_row) as connection:
        yield connection


def _domain(big: BigJob) -> charts.Domain:
    end = dt.datetime.now(dt.UTC)
    return end - dt.timedelta(seconds=big.seconds + 60), end


def _spec(chart: Any) -> dict[str, Any]:
    """The chart's Vega-Lite spec with its data inline, past Altair's 5,000-row guard (Streamlit
    does not apply it; what is asserted here is the budget)."""
    with alt.data_transformers.disable_max_rows():
        return chart.to_dict()  # type: ignore[no-any-return]


def _rows(chart: Any) -> dict[str, int]:
    """Rows of each dataset a chart carries: what Vega would be handed."""
    return {name: len(values) for name, values in _spec(chart)["datasets"].items()}


def _marks(spec: dict[str, Any]) -> list[str]:
    """Every mark type in a (possibly layered) Vega-Lite spec."""
    found = []
    if "mark" in spec:
        mark = spec["mark"]
        found.append(mark["type"] if isinstance(mark, dict) else mark)
    for layer in spec.get("layer", []):
        found += _marks(layer)
    return found


def test_points_per_series_splits_the_budget() -> None:
    assert points_per_series(8000, 1, 600) == 600  # one series: the single-series resolution
    assert points_per_series(8000, 64, 600) == 125
    assert points_per_series(8000, 512, 600) == 15
    assert points_per_series(8000, 4096, 600) == MIN_SERIES_POINTS  # past the floor a huge job goes over
    assert points_per_series(8000, 0, 600) == 600


@pytest.mark.parametrize("cells", [2000, 8000])
def test_heatmap_of_many_gpus_stays_within_the_cell_budget(conn: Any, big_job: BigJob, cells: int) -> None:
    rows = read_gpu_grid(conn, big_job.cluster, big_job.job_id, cells, 600)
    per_gpu = Counter((r["node"], r["gpu_index"]) for r in rows)
    assert len(per_gpu) == big_job.gpus == 64
    assert max(per_gpu.values()) <= cells // big_job.gpus
    # 64 GPUs x 30 minutes at 1 Hz are more raw samples than a grid may read: the page reads the
    # minute rollup's grid (two-minute buckets), for the whole run, not a slice of it.
    assert big_job.gpus * big_job.seconds > RAW_ROWS_MAX
    grid = big_job.seconds // queries.ROLLUP_MIN_BUCKET_S
    assert grid - 1 <= min(per_gpu.values()) <= max(per_gpu.values()) <= grid
    assert sum(r["samples"] for r in rows) == big_job.gpus * big_job.seconds  # every sample in one cell
    heatmap = charts.gpu_heatmap(charts.gpu_frame(pd.DataFrame(rows)), _domain(big_job))
    assert len(drawn_heatmap.cells(_spec(heatmap)["datasets"])) == len(rows) <= cells
    # What goes to the browser is a row a GPU besides the picture, whatever the cells.
    assert sorted(_rows(heatmap).values()) == [1, 2, big_job.gpus]
    # The heatmap shares the page's one time axis: a temporal x with the picture's end as x2.
    encoding = _spec(heatmap)["layer"][0]["encoding"]
    assert encoding["x"]["type"] == "temporal" and encoding["x2"]["field"] == "end"


def test_a_budget_just_under_the_rollup_s_minute_reads_the_rollup(conn: Any, big_job: BigJob) -> None:
    """15 buckets over 30 minutes are about two minutes wide, a second either side of the rollup's
    threshold: the page takes 14 rather than scan every sample."""
    start = dt.datetime(2024, 3, 4, 12, 0, 0, tzinfo=dt.UTC)
    window = TimeRange(start, start + dt.timedelta(seconds=1799))
    assert window.bucket_seconds(15) < queries.ROLLUP_MIN_BUCKET_S
    assert rollup_points(window, 15) == 14
    assert rollup_points(window, 125) == 125  # a rollup half as fine: not worth it
    assert rollup_points(TimeRange(start, start + dt.timedelta(hours=1)), 10) == 10  # already

    rows = read_gpu_grid(conn, big_job.cluster, big_job.job_id, big_job.gpus * 15, 600)
    per_gpu = Counter((r["node"], r["gpu_index"]) for r in rows)
    assert len(per_gpu) == big_job.gpus and max(per_gpu.values()) <= 15
    buckets = sorted({r["bucket"] for r in rows})
    assert min(b - a for a, b in zip(buckets, buckets[1:], strict=False)).total_seconds() >= 120
    assert sum(r["samples"] for r in rows) == big_job.gpus * big_job.seconds


def test_gpu_lines_of_a_node_stay_within_the_line_budget(conn: Any, big_job: BigJob) -> None:
    frame = charts.gpu_frame(pd.DataFrame(read_gpu_grid(conn, big_job.cluster, big_job.job_id, 8000, 600)))
    node = sorted(frame["node"].unique())[0]
    assert len(frame[frame["node"] == node]) in (8 * 14, 8 * 15)  # the minute rollup's grid; over 80: merged
    chart = charts.gpu_lines(frame, "mem_used_gib", node, _domain(big_job), None, 80)
    (shown,) = _spec(chart)["datasets"].values()
    assert len(shown) <= 80
    assert len({row["gpu"] for row in shown}) == 8
    # Merged buckets start where the node's first bucket did and keep memory's maximum.
    mine = frame[frame["node"] == node]
    assert min(pd.Timestamp(row["bucket"]) for row in shown) == mine["bucket"].min()
    assert max(row["mem_used_gib"] for row in shown) == mine["mem_used_gib"].max()


def test_many_ranks_are_a_band_with_only_the_outliers_as_lines(conn: Any, big_job: BigJob) -> None:
    steps = pd.DataFrame(read_step_grid(conn, big_job.cluster, big_job.job_id, 8000, 600))
    assert steps["rank"].nunique() == 64 and len(steps) <= 8000
    stragglers = rank_outliers.find_stragglers(steps)
    assert stragglers == [big_job.straggler]  # the one rule
    view = rank_outliers.step_view(steps, stragglers, 4000)
    assert view.band is not None and view.ranks == 64
    assert view.outliers == [big_job.straggler, big_job.spike] and view.hidden == 0
    assert set(view.lines["rank"]) == {big_job.straggler, big_job.spike}
    assert (view.band["ranks"] == 64).all()
    assert view.band["median"].between(0.45, 0.55).all()
    assert (view.band["high"] < 0.9).all()  # the straggler and the stall are outside the band, not its edge

    spec = _spec(charts.step_chart(view, _domain(big_job), None))
    assert {"area", "line"} <= set(_marks(spec))
    shipped = spec["datasets"]
    line_ranks = {row["rank"] for values in shipped.values() for row in values if "rank" in row}
    assert line_ranks == {big_job.straggler, big_job.spike}
    assert sum(len(values) for values in shipped.values()) <= 4000


def test_the_band_s_outliers_are_capped_stragglers_first() -> None:
    buckets = pd.date_range("2024-03-04", periods=20, freq="min", tz="UTC")
    slow = {r: 1.0 + 0.01 * r for r in range(10, 22)}  # twelve slow ranks of 40, rank 21 the slowest
    steps = pd.DataFrame([{"rank": r, "bucket": b, "duration_s": slow.get(r, 0.5), "steps": 60,
                           "last_step": i} for r in range(40) for i, b in enumerate(buckets)])
    stragglers = rank_outliers.find_stragglers(steps)
    assert stragglers == sorted(slow)  # the banner's order
    view = rank_outliers.step_view(steps, stragglers, 4000)
    assert view.outliers == list(range(21, 21 - rank_outliers.MAX_OUTLIER_LINES, -1))  # the slowest drawn
    assert view.hidden == len(slow) - rank_outliers.MAX_OUTLIER_LINES
    assert set(view.lines["rank"]) == set(view.outliers)


@pytest.mark.parametrize(("ranks", "band"), [(1, False), (4, False), (5, True)])
def test_few_ranks_get_a_line_each_and_more_a_band(ranks: int, band: bool) -> None:
    buckets = pd.date_range("2024-03-04", periods=600, freq="s", tz="UTC")
    steps = pd.DataFrame([{"rank": r, "bucket": b, "duration_s": 0.5 + 0.01 * r, "steps": 1, "last_step": i}
                          for r in range(ranks) for i, b in enumerate(buckets)])
    view = rank_outliers.step_view(steps, [], 4000)
    assert (view.band is not None) is band
    assert set(view.lines["rank"]) == (set() if band else set(range(ranks)))


def test_the_seeded_two_rank_job_keeps_its_lines(conn: Any, seeded: Seed) -> None:
    settings = load_dashboard_settings()
    steps = pd.DataFrame(read_step_grid(conn, seeded.cluster, seeded.running, settings.heatmap_cells,
                                        settings.chart_points))
    assert Counter(steps["rank"]) == {0: settings.chart_points, 1: settings.chart_points}  # full resolution
    view = rank_outliers.step_view(steps, rank_outliers.find_stragglers(steps), settings.line_points)
    assert view.band is None and set(view.lines["rank"]) == {0, 1}
    spec = _spec(charts.step_chart(view, (steps["bucket"].min(), steps["bucket"].max()), None))
    assert "area" not in _marks(spec) and spec["title"] == "Step time per rank"


def test_ranks_that_went_silent_early_still_fit_the_budget(conn: Any, database_url: str) -> None:
    """40 ranks to the end and 40 that stopped after five minutes: the probe of the last minutes sees
    40, the full read finds 80 and is read again at the resolution that fits them."""
    cluster, job = f"silent-{uuid.uuid4().hex[:8]}", "silent"
    start = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(minutes=30)
    with psycopg.connect(database_url, autocommit=True) as writer:
        writer.execute(
            """INSERT INTO steps (cluster, job_id, ts, node, rank, step, phase, duration_s)
               SELECT %s, %s, %s + make_interval(secs => t), 'n1', r, t, 'train', 0.5
               FROM generate_series(0, 1799) t, generate_series(0, 79) r WHERE r < 40 OR t < 300""",
            (cluster, job, start))
    rows = read_step_grid(conn, cluster, job, 4000, 600)
    per_rank = Counter(r["rank"] for r in rows)
    assert len(per_rank) == 80 and len(rows) <= 4000


def test_a_metric_every_rank_logs_fits_one_chart_s_budget(conn: Any, database_url: str) -> None:
    """``loss`` from 64 ranks every second and ``lr`` from rank 0: each chart within 4,000 points,
    and rank 0's lone ``lr`` at the single-series resolution."""
    cluster, job = f"metrics-{uuid.uuid4().hex[:8]}", "metrics"
    start = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(minutes=30)
    with psycopg.connect(database_url, autocommit=True) as writer:
        writer.execute(
            """INSERT INTO metrics (cluster, job_id, ts, rank, step, name, value)
               SELECT %s, %s, %s + make_interval(secs => t), r, t, m, 1.0 / (1 + t)
               FROM generate_series(0, 1799) t, generate_series(0, 63) r, unnest(ARRAY['loss', 'lr']) m
               WHERE m = 'loss' OR r = 0""",
            (cluster, job, start))
    rows = pd.DataFrame(read_metric_grid(conn, cluster, job, 4000, 600))
    per_name = rows.groupby("name")["rank"].agg(["nunique", "size"])
    assert per_name.loc["loss", "nunique"] == 64 and per_name.loc["loss", "size"] <= 4000
    assert per_name.loc["lr", "nunique"] == 1 and per_name.loc["lr", "size"] <= 4000 // 64  # read with loss's grid
    chart = charts.metric_chart(rows, "loss", (start, dt.datetime.now(dt.UTC)), 4000)
    assert sum(_rows(chart).values()) <= 4000


def _shipped(element: Any) -> tuple[dict[str, Any], int]:
    """A rendered chart's Vega-Lite spec and the rows of data Streamlit sends with it."""
    proto = element.proto
    rows = sum(pa.ipc.open_stream(d.data.data).read_all().num_rows for d in proto.datasets)
    if proto.data.data:
        rows += pa.ipc.open_stream(proto.data.data).read_all().num_rows
    return json.loads(proto.spec), rows


def test_job_page_of_many_gpus_ships_within_the_budgets(app_as: Callable[..., AppTest], big_job: BigJob) -> None:
    settings = load_dashboard_settings()
    # The whole run: the stall a third of the way in is before the running job's default window (its last 15 min).
    at = app_as("root", "views/job.py", cluster=big_job.cluster, job=big_job.job_id, window="all")
    assert not at.exception, [e.value for e in at.exception]
    said = texts(at)
    assert f"Straggler rank(s): {big_job.straggler}" in said
    assert "64 ranks: the band" in said and f"Drawn alone: {big_job.straggler} (straggler), {big_job.spike}." in said
    shipped = [_shipped(element) for element in at.get("vega_lite_chart")]
    titles = [json.dumps(spec.get("title")) for spec, _ in shipped]
    heatmap = next(rows for (spec, rows), title in zip(shipped, titles, strict=True) if "every GPU" in title)
    assert heatmap <= settings.heatmap_cells
    assert any("Step time across 64 ranks" in title for title in titles)
    for (_, rows), title in zip(shipped, titles, strict=True):
        if "every GPU" not in title:
            assert rows <= settings.line_points, title
    # Before budgets this page shipped 64 × 600 heatmap cells, 64 × 600 step points and
    # 4 × 2 × 8 × 600 GPU line points: 115,200 rows.
    assert sum(rows for _, rows in shipped) < 20_000
