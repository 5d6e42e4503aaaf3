"""The job page's time window (issue #43, item 1): a running job's recent window at the sampling's own
resolution, however long the job has run; the whole run from the rollups, not its raw rows.

A running 16-GPU job with 40 minutes of 1 Hz samples: past the raw-rows cap (16 × 2,400 samples) that,
before the window, took the whole page to two-minute buckets after about 21 minutes. Read as the page
reads it (``read_gpu_grid`` with the page's settings) and on the page itself (AppTest).
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pandas as pd
import psycopg
import pytest
from psycopg.rows import DictRow, dict_row
from streamlit.testing.v1 import AppTest

from jobsight.collector.query import series as queries
from jobsight.collector.query.grids import RAW_ROWS_MAX, read_gpu_grid, read_gpu_grid_by_gpu
from jobsight.dashboard import charts, gpu_columns, time_window, vega
from jobsight.dashboard.settings import load_dashboard_settings
from tests.dashboard import drawn_heatmap
from tests.dashboard.conftest import texts
from tests.dashboard.seed import BigJob, Seed, seed_big_job

RECENT = dt.timedelta(minutes=15)
RAW_TABLES = ("gpu_samples", "gpu_sample_blocks", "gpu_sample_timelines")
"""The raw tier's tables (and their partitions): the hot samples and the packed blocks."""


@pytest.fixture(scope="module")
def sixteen(database_url: str) -> BigJob:
    """2 nodes × 8 GPUs, 40 minutes at 1 Hz, running, on a cluster of its own."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        return seed_big_job(conn, f"window-{uuid.uuid4().hex[:8]}", "w-16", nodes=2, seconds=2400)


class Recording(psycopg.Connection[DictRow]):
    """A connection that keeps every statement it runs, so a test can EXPLAIN what a read scanned."""

    statements: list[tuple[str, Any]]

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        self.statements.append((str(query), params))
        return super().execute(query, params, **kwargs)


@pytest.fixture
def recording(database_url: str) -> Iterator[Recording]:
    with Recording.connect(database_url, row_factory=dict_row) as conn:
        conn.statements = []
        yield conn


def _raw_rows_scanned(conn: psycopg.Connection[DictRow], statements: list[tuple[str, Any]]) -> int:
    """Rows the raw tier's scans gave in ``statements``, each run again under EXPLAIN ANALYZE."""

    def scanned(node: dict[str, Any]) -> int:
        own = node.get("Actual Rows", 0) * node.get("Actual Loops", 1) \
            if str(node.get("Relation Name", "")).startswith(RAW_TABLES) else 0
        return own + sum(scanned(child) for child in node.get("Plans", []))

    total = 0
    for query, params in statements:
        if not query.lstrip().upper().startswith(("SELECT", "WITH")) or "set_config" in query:
            continue
        plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query, params).fetchone()
        assert plan is not None
        total += scanned(plan["QUERY PLAN"][0]["Plan"])
    return int(total)


def test_the_recent_window_is_drawn_at_the_sampling_interval(recording: Recording, sixteen: BigJob) -> None:
    settings = load_dashboard_settings()
    rows = read_gpu_grid(recording, sixteen.cluster, sixteen.job_id, settings.heatmap_cells, settings.chart_points,
                         span=RECENT)
    assert {r["interval_s"] for r in rows} == {1.0}
    assert {r["bucket_s"] for r in rows} == {1.0}  # a cell a sample, not the 2-minute buckets of the whole run
    per_gpu = Counter((r["node"], r["gpu_index"]) for r in rows)
    assert len(per_gpu) == 16 and set(per_gpu.values()) == {901}  # 15 minutes of samples, both ends in
    assert {r["samples"] for r in rows} == {1}
    assert min(r["bucket"] for r in rows) >= max(r["bucket"] for r in rows) - RECENT - dt.timedelta(seconds=1)
    # What it read from the raw tier is what it draws, besides the page's probe of the last two minutes.
    assert _raw_rows_scanned(recording, recording.statements) <= len(rows) + 16 * 121 <= RAW_ROWS_MAX
    # The heatmap draws those cells, each as wide as its bucket.
    frame = charts.gpu_frame(pd.DataFrame(rows))
    end = dt.datetime.now(dt.UTC)
    cells = drawn_heatmap.cells(vega.spec(charts.gpu_heatmap(frame, (end - RECENT, end)))["datasets"])
    assert len(cells) == len(rows)
    assert set(cells["end"] - cells["bucket"]) == {pd.Timedelta(seconds=1)}


def test_all_of_it_reads_the_rollups_not_more_raw_rows_than_the_cap(recording: Recording, sixteen: BigJob) -> None:
    settings = load_dashboard_settings()
    assert sixteen.gpus * sixteen.seconds > RAW_ROWS_MAX
    rows = read_gpu_grid(recording, sixteen.cluster, sixteen.job_id, settings.heatmap_cells, settings.chart_points)
    assert min(r["bucket_s"] for r in rows) >= queries.ROLLUP_MIN_BUCKET_S  # the per-minute rollup's buckets
    assert sum(r["samples"] for r in rows) == sixteen.gpus * sixteen.seconds  # every sample counted once
    assert _raw_rows_scanned(recording, recording.statements) <= RAW_ROWS_MAX


def test_a_long_window_of_many_samples_reads_the_rollups(recording: Recording, sixteen: BigJob) -> None:
    """The last hour of a 40-minute job is all of it: as many samples as the whole run, so the rollup."""
    settings = load_dashboard_settings()
    rows = read_gpu_grid(recording, sixteen.cluster, sixteen.job_id, settings.heatmap_cells, settings.chart_points,
                         span=dt.timedelta(hours=1))
    assert min(r["bucket_s"] for r in rows) >= queries.ROLLUP_MIN_BUCKET_S
    assert _raw_rows_scanned(recording, recording.statements) <= RAW_ROWS_MAX


@pytest.mark.parametrize("span", [RECENT, None], ids=["recent", "all"])
def test_the_page_reads_a_row_a_gpu_and_draws_the_same_cells(recording: Recording, sixteen: BigJob,
                                                              span: dt.timedelta | None) -> None:
    """The page reads its GPUs a row a GPU (``read_gpu_grid_by_gpu``, its buckets as arrays) and builds its
    frame a column at a time: the frame of the grid's rows, cell for cell, from the same raw rows."""
    settings = load_dashboard_settings()
    budget = (recording, sixteen.cluster, sixteen.job_id, settings.heatmap_cells, settings.chart_points)
    rows = read_gpu_grid(*budget, span=span, measures=queries.UTILISATION)
    scanned = _raw_rows_scanned(recording, recording.statements)
    recording.statements = []
    frame = gpu_columns.frame(read_gpu_grid_by_gpu(*budget, span=span, measures=queries.UTILISATION),
                              queries.UTILISATION)
    assert _raw_rows_scanned(recording, recording.statements) == scanned
    expected = pd.DataFrame(rows)[list(frame.columns)]
    assert len(frame) == len(rows) > 16
    pd.testing.assert_frame_equal(frame, expected, check_dtype=False)
    assert frame["bucket"].dt.tz is not None and frame["util_gpu"].dtype == float


def test_windows_clip_the_domain_and_keep_to_the_address_s_tokens() -> None:
    end = dt.datetime(2024, 3, 4, 12, tzinfo=dt.UTC)
    run = (end - dt.timedelta(hours=2), end)
    assert time_window.clip(run, time_window.span("last 15 min")) == (end - RECENT, end)
    assert time_window.clip(run, time_window.span("last 6 h")) == run  # shorter than the window: all of it
    assert time_window.clip(run, time_window.span("all")) == run
    assert time_window.default(running=True) == "last 15 min" and time_window.default(running=False) == "all"
    param = time_window.param(running=True)
    assert {param.text(choice) for choice in time_window.SPANS} == {"15m", "1h", "6h", "all"}
    assert all(param.parse(param.text(choice)) == choice for choice in time_window.SPANS)
    assert param.parse("3d") is None


def _heatmap_caption(at: AppTest) -> str:
    return next(c.value for c in at.caption if "each cell and point is a" in c.value)


def test_the_running_job_s_page_opens_on_its_recent_window(app_as: Callable[..., AppTest], sixteen: BigJob) -> None:
    at = app_as("root", "views/job.py", cluster=sixteen.cluster, job=sixteen.job_id)
    assert not at.exception, [e.value for e in at.exception]
    assert at.radio(key=time_window.KEY).value == "last 15 min"
    assert "each cell and point is a 1 s bucket" in _heatmap_caption(at)
    at.radio(key=time_window.KEY).set_value("all").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.query_params["window"] == "all"  # kept in the address, as the page's other choices
    assert re.search(r"each cell and point is a 2(\.\d+)? min bucket", _heatmap_caption(at))  # the minute rollup


def test_an_ended_job_s_page_opens_on_all_of_it(app_as: Callable[..., AppTest], dashboard_env: Seed) -> None:
    at = app_as("alice", "views/job.py", cluster=dashboard_env.cluster, job=dashboard_env.alice_done)
    assert not at.exception, [e.value for e in at.exception]
    assert at.radio(key=time_window.KEY).value == "all"
    assert "window" not in at.query_params  # the default is left out of the address
    said = texts(at)
    assert "No GPU samples" in said
