"""GPU charts true to time at any sampling interval (issue #17, part 2).

One running job per sampling interval, 2 GPUs on one node, each sample a few milliseconds off its
tick as a node daemon's are: 1 s for 9 minutes, 15 s for the last 15 minutes of a 20-minute job
(the issue's), 30 s for 30 minutes and 60 s for an hour; and a 15 s job with a lost sample and a
five-minute outage. Read as the job page reads them (``read_gpu_grid`` with the page's settings) and
drawn by the page's chart functions.

Checked: the query finds the interval and never cuts a bucket narrower; the heatmap's cells tile
the run on the time axis without holes; each GPU's line spans its samples (first and last bucket
within one interval of the first and last sample) with at most 1 % of its buckets isolated (no
other bucket within the join distance on either side); an outage is a gap in the line and in the
heatmap, a lost sample is not, and merging buckets for the line budget never bridges an outage.
The browser test draws each job page in headless Chromium: screenshots in ``/tmp/sampling-shots/``.
"""

from __future__ import annotations

import datetime as dt
import io
import math
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import altair as alt
import pandas as pd
import psycopg
import pytest
from psycopg.rows import dict_row

from jobsight.collector.query import sampling
from jobsight.collector.query.grids import read_gpu_grid
from jobsight.collector.query.time_range import TimeRange
from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.store.schema import PARTITIONED_TABLES
from jobsight.collector.tiers.rollup import rebuild_minutes
from jobsight.dashboard import charts, vega
from jobsight.dashboard.settings import load_dashboard_settings
from tests.collector.test_up import Up
from tests.dashboard import drawn_heatmap
from tests.dashboard.test_browser import _wait, headless_chromium

SHOTS = Path("/tmp/sampling-shots")
JITTER_S = 0.02
"""How far a sample lands from its tick, at most: a node daemon's ticks do not drift, but each
snapshot takes a few milliseconds, some more than others."""


@dataclass(frozen=True)
class SampledJob:
    job_id: str
    interval_s: int
    start: dt.datetime
    """When the job started: the charts' domain runs from here to now."""
    first: dt.datetime
    last: dt.datetime
    ticks: int
    missing: frozenset[int] = frozenset()
    """Ticks with no sample."""

    @property
    def samples(self) -> int:
        return self.ticks - len(self.missing)


@dataclass(frozen=True)
class Sampled:
    cluster: str
    jobs: dict[str, SampledJob]


def _seed_job(conn: psycopg.Connection[Any], cluster: str, job_id: str, interval_s: int, run: dt.timedelta,
              sampled: dt.timedelta, end: dt.datetime, missing: frozenset[int] = frozenset()) -> SampledJob:
    """A running job that started ``run`` before ``end``, its 2 GPUs sampled every ``interval_s`` over
    the last ``sampled`` of it (the last tick at ``end``) but for the ``missing`` ticks, in SQL with the
    minute rollups rebuilt as the ingest path keeps them."""
    ticks = int(sampled.total_seconds()) // interval_s + 1
    first = end - dt.timedelta(seconds=(ticks - 1) * interval_s)
    conn.execute(
        """INSERT INTO jobs (cluster, job_id, user_name, account, partition, name, nodes, node_count, gpus,
                             start_time, state, last_seen)
           VALUES (%s, %s, 'alice', 'ml', 'gpu', %s, '{n1}', 1, '{n1:0,n1:1}', %s, 'running', %s)""",
        (cluster, job_id, f"sampled every {interval_s} s", end - run, end),
    )
    conn.execute(
        """INSERT INTO gpu_samples (cluster, job_id, ts, node, gpu_index, gpu_uuid, gpu_name, util_gpu, util_mem,
                                    mem_used, mem_total, power_w, energy_j, temp_c, lost)
           SELECT %(c)s, %(j)s, %(first)s + make_interval(secs => k * %(every)s + %(jitter)s * sin(7 * k + g)),
                  'n1', g, 'GPU-' || g, 'NVIDIA H100', 55 + 35 * sin(k * %(every)s / 120.0 + g), 30,
                  (20 + g) * 2^30, 80 * 2^30, 300 + g * 50, k * %(every)s * 300.0, 55 + g, false
           FROM generate_series(0, %(ticks)s - 1) k, generate_series(0, 1) g
           WHERE NOT k = ANY(%(missing)s)""",
        {"c": cluster, "j": job_id, "first": first, "every": interval_s, "jitter": JITTER_S, "ticks": ticks,
         "missing": sorted(missing)},
    )
    rebuild_minutes(conn, cluster, job_id)
    return SampledJob(job_id, interval_s, end - run, first, end, ticks, missing)


@pytest.fixture(scope="module")
def sampled(database_url: str) -> Sampled:
    cluster = f"sampling-{uuid.uuid4().hex[:8]}"
    end = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(seconds=5)
    minute = dt.timedelta(minutes=1)
    with psycopg.connect(database_url, autocommit=True) as conn:
        keeper = PartitionKeeper()
        for table in PARTITIONED_TABLES:
            keeper.ensure(conn, table, {(end - 61 * minute).date(), end.date()})
        with conn.transaction():
            jobs = {
                "1s": _seed_job(conn, cluster, "every-1s", 1, 9 * minute, 9 * minute, end),
                "15s": _seed_job(conn, cluster, "every-15s", 15, 20 * minute, 15 * minute, end),
                "30s": _seed_job(conn, cluster, "every-30s", 30, 30 * minute, 30 * minute, end),
                "60s": _seed_job(conn, cluster, "every-60s", 60, 60 * minute, 60 * minute, end),
                # 40 minutes every 15 s: tick 30 lost, ticks 80-99 (five minutes) an outage.
                "outage": _seed_job(conn, cluster, "outage-15s", 15, 40 * minute, 40 * minute, end,
                                    frozenset({30, *range(80, 100)})),
            }
    return Sampled(cluster, jobs)


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, row_factory=dict_row) as connection:
        yield connection


def _page_rows(conn: psycopg.Connection[Any], cluster: str, job: SampledJob) -> pd.DataFrame:
    """The GPU rows the job page reads, with its default settings, as its charts take them."""
    settings = load_dashboard_settings()
    rows = read_gpu_grid(conn, cluster, job.job_id, settings.heatmap_cells, settings.chart_points)
    return charts.gpu_frame(pd.DataFrame(rows))


def _domain(job: SampledJob) -> charts.Domain:
    return job.first, job.last + dt.timedelta(seconds=5)


def _shipped(chart: Any) -> pd.DataFrame:
    """The one dataset a chart hands Vega, as a frame (times parsed back)."""
    with alt.data_transformers.disable_max_rows():
        (values,) = chart.to_dict()["datasets"].values()
    frame = pd.DataFrame(values)
    return frame.assign(bucket=pd.to_datetime(frame["bucket"], utc=True))


def _sample_times(conn: psycopg.Connection[Any], cluster: str, job: SampledJob) -> dict[str, tuple[Any, Any]]:
    rows = conn.execute("""SELECT 'n1:' || gpu_index AS gpu, min(ts) AS first, max(ts) AS last FROM gpu_samples
                           WHERE cluster = %s AND job_id = %s GROUP BY gpu_index""", (cluster, job.job_id)).fetchall()
    return {r["gpu"]: (pd.Timestamp(r["first"]), pd.Timestamp(r["last"])) for r in rows}


def isolated(buckets: pd.Series, join: pd.Timedelta) -> int:
    """Buckets (one series' starts, in order) with no other bucket within ``join`` on either side: what
    a line chart cannot draw as a line."""
    gaps = buckets.diff()
    before, after = gaps, gaps.shift(-1)
    alone = ~(before <= join) & ~(after <= join)
    return int(alone.sum())


INTERVALS = ["1s", "15s", "30s", "60s"]


@pytest.mark.parametrize("name", INTERVALS)
def test_buckets_are_never_narrower_than_the_sampling_interval(conn: psycopg.Connection[Any], sampled: Sampled,
                                                                name: str) -> None:
    job = sampled.jobs[name]
    window = TimeRange(job.first, job.last)
    found = sampling.sampling_interval(conn, sampled.cluster, job.job_id, window)
    assert found is not None and found == pytest.approx(job.interval_s, abs=2 * JITTER_S)
    frame = _page_rows(conn, sampled.cluster, job)
    assert (frame["bucket_s"] >= found).all() and (frame["interval_s"] == found).all()
    # About a sample a bucket: as fine as the samples allow, no finer (a bucket a hair wider than the
    # interval takes two samples once in a while).
    assert frame["samples"].sum() == 2 * job.samples and frame["samples"].between(1, 2).all()
    assert len(frame) >= 0.99 * 2 * job.samples


@pytest.mark.parametrize("name", INTERVALS)
def test_the_heatmap_tiles_the_run_on_a_time_axis(conn: psycopg.Connection[Any], sampled: Sampled, name: str) -> None:
    job = sampled.jobs[name]
    frame = _page_rows(conn, sampled.cluster, job)
    spec = vega.spec(charts.gpu_heatmap(frame, _domain(job)))
    picture = spec["layer"][0]["encoding"]
    assert picture["x"]["type"] == "temporal" and picture["x2"]["field"] == "end"
    cells = drawn_heatmap.cells(spec["datasets"])
    assert len(cells) == len(frame)  # a cell a bucket read, none lost or made up
    width = charts.bucket_width(frame)
    assert width is not None and (frame["bucket_s"] >= frame["interval_s"]).all()
    for gpu, mine in cells.groupby("gpu"):
        mine = mine.sort_values("bucket")
        assert ((mine["end"] - mine["bucket"]) == width).all(), gpu
        # Each cell ends where the next begins: no holes, no overlaps.
        assert (mine["bucket"].iloc[1:].to_numpy() == mine["end"].iloc[:-1].to_numpy()).all(), gpu


@pytest.mark.parametrize("name", INTERVALS)
def test_the_line_chart_spans_the_job_with_no_isolated_points(conn: psycopg.Connection[Any], sampled: Sampled,
                                                             name: str) -> None:
    job = sampled.jobs[name]
    frame = _page_rows(conn, sampled.cluster, job)
    settings = load_dashboard_settings()
    shown = _shipped(charts.gpu_lines(frame, "util_gpu", "n1", _domain(job), None, settings.line_points))
    interval = pd.Timedelta(seconds=job.interval_s)
    width = charts.bucket_width(frame)
    assert width is not None and (frame["bucket_s"] >= frame["interval_s"]).all()
    join = width * charts.JOIN_BUCKETS
    for gpu, (first_sample, last_sample) in _sample_times(conn, sampled.cluster, job).items():
        mine = shown[shown["gpu"] == gpu].sort_values("bucket")
        buckets = mine.loc[mine["point"] == "bucket", "bucket"]
        # The data spans the job: its first and last buckets hold its first and last samples, within an interval.
        assert buckets.iloc[0] <= first_sample < buckets.iloc[0] + width
        assert abs(buckets.iloc[0] - first_sample) <= interval
        assert buckets.iloc[-1] <= last_sample < buckets.iloc[-1] + width
        assert abs(buckets.iloc[-1] - last_sample) <= interval
        # Drawn to the end of the last bucket, in one unbroken line.
        assert mine["bucket"].iloc[-1] == buckets.iloc[-1] + width and mine["point"].iloc[-1] == "end"
        assert mine["util_gpu"].notna().all() and (mine["point"] != "gap").all()
        assert isolated(buckets, join) <= 0.01 * len(buckets), gpu
        assert len(buckets) >= 0.99 * job.samples


def test_an_outage_is_a_gap_and_a_lost_sample_is_not(conn: psycopg.Connection[Any], sampled: Sampled) -> None:
    job = sampled.jobs["outage"]
    frame = _page_rows(conn, sampled.cluster, job)
    width = pd.Timedelta(seconds=job.interval_s)
    outage = (job.first + 80 * width, job.first + 99 * width)  # ticks 80-99 have no sample
    lost = job.first + 30 * width
    heatmap = drawn_heatmap.cells(vega.spec(charts.gpu_heatmap(frame, _domain(job)))["datasets"])
    assert not heatmap["bucket"].between(outage[0] - width / 2, outage[1] + width / 2).any()
    # Drawn up to the outage, and transparent across it (the picture has its columns, empty).
    assert heatmap["bucket"].between(outage[0] - width * 2, outage[0]).any()
    for budget in (4000, 100):  # every bucket; and four merged into one (a minute), the outage still over three
        shown = _shipped(charts.gpu_lines(frame, "util_gpu", "n1", _domain(job), None, budget))
        assert len(shown) <= budget
        for gpu, mine in shown.groupby("gpu"):
            mine = mine.sort_values("bucket")
            gaps = mine[mine["point"] == "gap"]
            # One break, inside the outage, with no value for Vega to draw across; none at the lost sample.
            assert len(gaps) == 1 and gaps["util_gpu"].isna().all(), (budget, gpu)
            assert outage[0] < gaps["bucket"].iloc[0] < outage[1]
            assert not mine.loc[mine["point"] == "bucket", "bucket"].between(outage[0], outage[1]).any()
            before = mine[mine["bucket"] < gaps["bucket"].iloc[0]]
            assert before["point"].iloc[-1] == "end" and before["bucket"].iloc[-1] <= outage[0]
            assert (before["bucket"] <= lost).any() and (before["bucket"] > lost).any()  # joined across it
            assert (mine["point"] == "end").sum() == 2


def test_merging_keeps_time(conn: psycopg.Connection[Any], sampled: Sampled) -> None:
    """Merged buckets sit on the grid: a wider bucket starts where the first it merged did, and the
    merged line still spans the samples."""
    job = sampled.jobs["1s"]
    frame = _page_rows(conn, sampled.cluster, job)
    shown = _shipped(charts.gpu_lines(frame, "util_gpu", "n1", _domain(job), None, 100))
    assert len(shown) <= 100
    for gpu, mine in shown.groupby("gpu"):
        buckets = mine.loc[mine["point"] == "bucket", "bucket"].sort_values()
        steps = buckets.diff().dropna()
        assert steps.nunique() == 1, gpu  # one grid
        wide = steps.iloc[0]
        assert buckets.iloc[0] == frame["bucket"].min()
        assert mine["bucket"].max() == buckets.iloc[-1] + wide
        assert isolated(buckets, wide * charts.JOIN_BUCKETS) == 0
    assert math.isclose(shown["util_gpu"].mean(), frame["util_gpu"].mean(), rel_tol=0.05)


def test_the_page_says_how_often_its_gpus_were_sampled(conn: psycopg.Connection[Any], sampled: Sampled) -> None:
    note = charts.sampling_note(_page_rows(conn, sampled.cluster, sampled.jobs["15s"]))
    assert note is not None and note.startswith("GPUs sampled every 15 s; each cell and point is a 15 s bucket")


def test_a_short_run_s_time_axis_says_seconds() -> None:
    """Vega ticks a 10-minute axis every 30 s: in minutes alone it read 08:40, 08:40, 08:41."""
    start = dt.datetime(2024, 3, 4, 8, 40, tzinfo=dt.UTC)
    short = charts.time_x((start, start + dt.timedelta(minutes=10))).to_dict()
    long = charts.time_x((start, start + dt.timedelta(hours=1))).to_dict()
    assert (short["axis"]["format"], long["axis"]["format"]) == ("%H:%M:%S", "%H:%M")


def test_a_heatmap_of_two_gpus_is_not_squeezed_under_its_legend(conn: psycopg.Connection[Any],
                                                                 sampled: Sampled) -> None:
    frame = _page_rows(conn, sampled.cluster, sampled.jobs["15s"])
    spec = charts.gpu_heatmap(frame, _domain(sampled.jobs["15s"])).to_dict()
    assert spec["height"] == charts.HEATMAP_MIN_PX
    assert charts.heatmap_height(frame) == charts.HEATMAP_MIN_PX + charts.HEATMAP_FRAME_PX


def _runs(columns: list[int], joined: int = 3) -> list[tuple[int, int]]:
    """Runs of pixel columns (sorted), columns up to ``joined`` apart in one run."""
    runs: list[tuple[int, int]] = []
    for x in columns:
        if runs and x - runs[-1][1] <= joined:
            runs[-1] = (runs[-1][0], x)
        else:
            runs.append((x, x))
    return runs


def _drawn(png: bytes, colour: Any, left: float = 1.0) -> tuple[list[int], list[int]]:
    """The columns and the rows (within the image's ``left`` share) that hold a pixel of ``colour`` (a
    predicate on RGB)."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    width, height = image.size
    pixels = image.load()
    hits = [(x, y) for x in range(int(width * left)) for y in range(height) if colour(pixels[x, y])]
    return sorted({x for x, _ in hits}), sorted({y for _, y in hits})


def _line_blue(rgb: tuple[int, int, int]) -> bool:
    """Streamlit's first two series colours (#0068c9, #83c9ff), not the grey grid or the black axis."""
    r, _, b = rgb
    return b > 180 and b - r > 60


def _viridis(rgb: tuple[int, int, int]) -> bool:
    return max(rgb) - min(rgb) > 60


@pytest.fixture
def chromium() -> Iterator[Any]:
    yield from headless_chromium(1500)


@pytest.mark.browser
def test_each_job_page_draws_lines_across_the_run(chromium: Any, sampled: Sampled, database_url: str,
                                                  tmp_path: Path) -> None:
    """Each job's page in headless Chromium, as `jobsight up` serves it: the heatmap and the line chart
    drawn without a Vega error; screenshots to /tmp/sampling-shots/<job>.png."""
    from selenium.webdriver.common.by import By

    SHOTS.mkdir(parents=True, exist_ok=True)
    driver = chromium
    with Up(tmp_path / "data", tmp_path / "up.log", env={"JOBSIGHT_DATABASE_URL": database_url,
                                                         "JOBSIGHT_DASHBOARD_CLUSTER": sampled.cluster}) as up:
        for name, job in sampled.jobs.items():
            # All of each run (the outage is 15 to 20 minutes before the end, past the default window), with
            # the nodes' GPU lines.
            query = urlencode({"cluster": sampled.cluster, "job": job.job_id, "window": "all", "details": "nodes"})
            driver.get(f"http://127.0.0.1:{up.dashboard_port}/job?{query}")

            def drawn() -> bool:
                charts_drawn = driver.find_elements(
                    By.CSS_SELECTOR, '[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg')
                running = driver.find_elements(
                    By.CSS_SELECTOR, '[data-testid="stStatusWidget"] [data-testid="stStatusWidgetRunningIcon"]')
                return len(charts_drawn) >= 2 and not running

            try:
                _wait(drawn, 90, f"the charts of {job.job_id}")
                time.sleep(1.0)
                gpus = driver.find_element(By.XPATH, "//h3[contains(., 'GPUs')]")
                driver.execute_script("arguments[0].scrollIntoView();", gpus)
                time.sleep(0.5)
            finally:
                driver.save_screenshot(str(tmp_path / f"{name}.png"))
                console = driver.get_log("browser")
            shutil.copy(tmp_path / f"{name}.png", SHOTS / f"{name}.png")
            body = driver.find_element(By.TAG_NAME, "body").text
            assert not driver.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]'), body[:2000]
            assert f"Job {job.job_id}" in body and "GPUs sampled every " in body
            # What Chromium drew: the heatmap's rows at their height; each line across the samples' span
            # of the chart (the run, or the 15 of its 20 minutes it was sampled), broken at the outage.
            heatmap, lines = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stVegaLiteChart"]')[:2]
            _, rows = _drawn(heatmap.screenshot_as_png, _viridis, left=0.8)
            assert len(rows) >= charts.HEATMAP_MIN_PX - 5, name
            png = lines.screenshot_as_png
            columns, _ = _drawn(png, _line_blue)
            runs = sorted(_runs(columns), key=lambda run: run[1] - run[0], reverse=True)
            plot = lines.size["width"]
            share = (job.last - job.first) / (dt.datetime.now(dt.UTC) - job.start)  # of the domain, start to now
            if job.missing:
                first, second = sorted(runs[:2])
                assert second[0] - first[1] > 0.05 * plot, runs  # the five minutes without samples
                assert min(first[1] - first[0], second[1] - second[0]) > 0.2 * plot, runs
            else:
                assert runs[0][1] - runs[0][0] > 0.75 * share * plot, (runs, share)
            assert not [e for e in console if e.get("level") == "SEVERE"
                        and ("vega" in str(e).lower() or "embed." in str(e))], console
        assert up.interrupt() == 0
