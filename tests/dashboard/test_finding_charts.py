"""Charts that show what the findings say (issue #43, item 2), checked on their Vega-Lite specs.

The step chart's straggler apart from the band, with its own work per step (the figure the straggler
finding rests on) read, returned and drawn; the throughput in samples/s on an axis and at a height
that read; every GPU in a legend, or a title that says which; the date on a time axis that crosses
midnight; and every time chart of the job page given the height its plot and legends need (Streamlit
fits the whole chart into the height it is given: a 160-pixel chart kept a 10-pixel plot).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import altair as alt
import pandas as pd
import psycopg
import pyarrow as pa
import pytest
from psycopg.rows import dict_row
from streamlit.testing.v1 import AppTest

from jobsight.collector.query.grids import read_step_grid
from jobsight.collector.query.rank_outliers import BAND_FROM_RANKS, find_stragglers, step_view
from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.store.schema import PARTITIONED_TABLES
from jobsight.collector.tiers.step_rollup import rebuild as rebuild_steps
from jobsight.dashboard import charts, data
from jobsight.dashboard.settings import load_dashboard_settings
from tests.collector.test_up import Up
from tests.dashboard.seed import Seed
from tests.dashboard.test_browser import _wait, headless_chromium

RANKS, SLOW = 16, 11
"""The demo's shape: 16 ranks in lock step, rank 11's own work twice the others'."""
STRAGGLER_RED = "#e45756"


def _spec(chart: Any) -> dict[str, Any]:
    with alt.data_transformers.disable_max_rows():
        return chart.to_dict()  # type: ignore[no-any-return]


def _layers(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every single-view spec of a (possibly nested) layered spec."""
    if "layer" in spec:
        for layer in spec["layer"]:
            yield from _layers(layer)
    else:
        yield spec


def _values(spec: dict[str, Any], layer: dict[str, Any]) -> list[dict[str, Any]]:
    return spec["datasets"][layer["data"]["name"]]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def lock_step(database_url: str) -> tuple[str, str]:
    """A running 16-rank job of 20 minutes, a step a second on every rank, every step 1.0 s long (the
    others wait for rank 11 in the all-reduce), and own work per step (data wait + forward) 0.45 s on
    every rank but rank 11's 0.9 s; the step rollup rebuilt as the ingest path keeps it."""
    cluster, job = f"lockstep-{uuid.uuid4().hex[:8]}", "lock-16"
    end = dt.datetime.now(dt.UTC).replace(microsecond=0)
    start = end - dt.timedelta(minutes=20)
    with psycopg.connect(database_url, autocommit=True) as conn:
        keeper = PartitionKeeper()
        for table in PARTITIONED_TABLES:
            keeper.ensure(conn, table, {start.date(), end.date()})
        conn.execute(
            """INSERT INTO jobs (cluster, job_id, user_name, account, partition, name, nodes, node_count, gpus,
                                 start_time, state, last_seen)
               VALUES (%s, %s, 'alice', 'ml', 'gpu', 'lock-step', '{n0,n1}', 2, %s, %s, 'running', %s)""",
            (cluster, job, [f"n{r // 8}:{r % 8}" for r in range(RANKS)], start, end))
        conn.execute(
            """INSERT INTO steps (cluster, job_id, ts, node, rank, pid, step, epoch, phase, duration_s, data_wait_s,
                                  forward_s, compute_s, samples)
               SELECT %(c)s, %(j)s, %(s)s + make_interval(secs => t), 'n' || (r / 8), r, 1000 + r, t, 0, 'train',
                      1.0, 0.05, CASE WHEN r = %(slow)s THEN 0.85 ELSE 0.40 END, 0.9, 32
               FROM generate_series(0, 1199) t, generate_series(0, %(ranks)s - 1) r""",
            {"c": cluster, "j": job, "s": start, "slow": SLOW, "ranks": RANKS})
        rebuild_steps(conn, cluster, job)
    return cluster, job


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, row_factory=dict_row) as connection:
        yield connection


@pytest.mark.parametrize("budget", [4000, 100])  # 100: the buckets merged for the budget keep own work
def test_the_straggler_s_own_work_per_step_is_returned(conn: psycopg.Connection[Any], lock_step: tuple[str, str],
                                                       budget: int) -> None:
    settings = load_dashboard_settings()
    steps = pd.DataFrame(read_step_grid(conn, *lock_step, settings.heatmap_cells, settings.chart_points))
    assert steps["own_s"].notna().all()
    view = data.step_view(steps, budget)
    assert view.stragglers == [SLOW] and view.own_work and view.outliers == [SLOW]
    assert view.band is not None and view.own_band is not None
    mine = view.lines[view.lines["rank"] == SLOW]
    assert len(mine) <= budget and mine["own_s"].round(6).eq(0.9).all()  # data wait + forward, the finding's figure
    # Its step time is everyone's (it lies on the band), its own work far above the others'.
    assert mine["duration_s"].round(6).eq(1.0).all() and view.band["median"].round(6).eq(1.0).all()
    assert view.own_band["median"].round(6).eq(0.45).all()


def _lock_step_view() -> Any:
    buckets = pd.date_range("2024-03-04 10:00", periods=60, freq="20s", tz="UTC")
    steps = pd.DataFrame([{"rank": r, "bucket": b, "duration_s": 1.0, "own_s": 0.9 if r == SLOW else 0.45,
                           "steps": 20, "samples": 640, "last_step": i}
                          for r in range(RANKS) for i, b in enumerate(buckets)])
    return step_view(steps, find_stragglers(steps), 4000), buckets


def test_the_straggler_is_drawn_apart_from_the_band_in_red() -> None:
    view, buckets = _lock_step_view()
    domain = (buckets[0].to_pydatetime(), buckets[-1].to_pydatetime())
    chart = charts.own_work_chart(view, domain, None)
    assert chart is not None
    spec = _spec(chart)
    assert "Own work per step" in str(spec["title"])
    band, median, straggler = _layers(spec)
    assert band["mark"]["type"] == "area" and median["mark"]["type"] == "line"
    # The straggler is a layer of its own, in the straggler's red, apart from the band's blues.
    assert {row["rank"] for row in _values(spec, straggler)} == {SLOW}
    colour = straggler["encoding"]["color"]["scale"]
    assert colour["range"][colour["domain"].index(f"rank {SLOW} (straggler)")] == STRAGGLER_RED
    assert STRAGGLER_RED not in (band["mark"].get("color"), median["mark"].get("color"))
    assert straggler["encoding"]["y"]["field"] == "own_s"
    lowest = min(row["own_s"] for row in _values(spec, straggler))
    assert lowest > max(row["high"] for row in _values(spec, band))  # above the band, not on it
    # The step-time chart says why its straggler line lies on the band.
    assert "step times are alike" in str(_spec(charts.step_chart(view, domain, None))["title"])


def test_few_ranks_draw_own_work_a_line_each_and_none_without_it() -> None:
    buckets = pd.date_range("2024-03-04 10:00", periods=30, freq="20s", tz="UTC")
    own = {0: 0.2, 1: 0.21, 2: 0.42}
    steps = pd.DataFrame([{"rank": r, "bucket": b, "duration_s": 0.5, "own_s": v, "steps": 10, "last_step": i}
                          for r, v in own.items() for i, b in enumerate(buckets)])
    assert len(own) < BAND_FROM_RANKS
    view = step_view(steps, find_stragglers(steps), 4000)
    domain = (buckets[0].to_pydatetime(), buckets[-1].to_pydatetime())
    spec = _spec(charts.own_work_chart(view, domain, None))
    (lines,) = _layers(spec)
    assert lines["encoding"]["y"]["field"] == "own_s"
    assert {row["rank"] for row in _values(spec, lines) if row["straggler"] == "straggler"} == {2}
    unmeasured = step_view(steps.drop(columns="own_s"), [], 4000)
    assert charts.own_work_chart(unmeasured, domain, None) is None


def test_the_job_page_draws_the_straggler_s_own_work(app_as: Callable[..., AppTest],
                                                    lock_step: tuple[str, str]) -> None:
    cluster, job = lock_step
    at = app_as("alice", "views/job.py", cluster=cluster, job=job)
    assert not at.exception, [e.value for e in at.exception]
    elements = at.get("vega_lite_chart")
    titles = [json.dumps(json.loads(element.proto.spec).get("title")) for element in elements]
    own = next(e.proto for e, title in zip(elements, titles, strict=True) if "Own work per step across 16" in title)
    datasets = {d.name: pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in own.datasets}
    drawn = [layer for layer in _layers(json.loads(own.spec)) if layer["encoding"]["y"]["field"] == "own_s"]
    assert {int(rank) for layer in drawn for rank in datasets[layer["data"]["name"]]["rank"]} == {SLOW}
    assert any("Throughput (samples/s" in title for title in titles)


@pytest.mark.parametrize("seconds", [10, 60])
def test_throughput_is_samples_per_second_whatever_the_bucket(seconds: int) -> None:
    """Two ranks, 32 samples a step, a step a second each: 64 samples/s in 10 s buckets and in 60 s
    ones (it read 640 and 3,840 "samples per bucket")."""
    buckets = pd.date_range("2024-03-04 10:00", periods=20, freq=f"{seconds}s", tz="UTC")
    steps = pd.DataFrame([{"rank": r, "bucket": b, "duration_s": 1.0, "steps": seconds, "samples": 32 * seconds}
                          for r in range(2) for b in buckets])
    domain = (buckets[0].to_pydatetime(), buckets[-1].to_pydatetime())
    spec = _spec(charts.throughput_chart(steps, domain))
    y = spec["encoding"]["y"]
    assert y["field"] == charts.THROUGHPUT_FIELD and y["title"] == "samples/s"
    assert "samples/s" in spec["title"]
    assert {row[charts.THROUGHPUT_FIELD] for row in _values(spec, spec)} == {64.0}
    assert y["axis"]["format"] == "~s"  # 50k, not 50,000 over a squashed axis
    assert spec["height"] >= charts.MIN_PLOT_PX
    assert charts.throughput_px() >= charts.THROUGHPUT_PLOT_PX + charts.CHART_FRAME_PX


def test_throughput_of_a_step_or_two_a_bucket_reads_the_rate_not_a_comb() -> None:
    """16 ranks stepping every second (32 samples a step) read in 1.8 s buckets, which hold one step or
    two: 512 samples/s, within the few per cent a merged bucket's last step in or out makes."""
    start = pd.Timestamp("2024-03-04 10:00", tz="UTC")
    buckets = [start + pd.Timedelta(seconds=1.8 * i) for i in range(500)]
    ticks = [sum(1 for t in range(901) if 1.8 * i <= t < 1.8 * (i + 1)) for i in range(500)]
    steps = pd.DataFrame([{"rank": r, "bucket": b, "duration_s": 1.0, "steps": n, "samples": 32 * n}
                          for r in range(16) for b, n in zip(buckets, ticks, strict=True)])
    rates = charts.throughput_rows(steps)[charts.THROUGHPUT_FIELD]
    assert set(ticks) == {1, 2} and len(rates) < len(buckets)  # merged
    assert rates.between(512 * 0.9, 512 * 1.1).all(), rates.describe()


def _gpu_frame(gpus: int) -> pd.DataFrame:
    buckets = pd.date_range("2024-03-04 10:00", periods=10, freq="1min", tz="UTC")
    rows = pd.DataFrame([{"node": "n1", "gpu_index": g, "bucket": b, "bucket_s": 60.0, "interval_s": 1.0,
                          "util_gpu": 50.0, "mem_used": 2**30, "power_w": 300.0, "temp_c": 60.0}
                         for g in range(gpus) for b in buckets])
    return charts.gpu_frame(rows)


@pytest.mark.parametrize("gpus", [8, 40])
def test_a_node_s_legend_lists_every_gpu_or_says_which(gpus: int) -> None:
    frame = _gpu_frame(gpus)
    domain = (frame["bucket"].min().to_pydatetime(), frame["bucket"].max().to_pydatetime())
    markers = pd.DataFrame([{"kind": "epoch", "start": domain[0], "end": domain[0], "label": "epoch 0"}])
    overlay = charts.marker_layer(markers, domain)
    spec = _spec(charts.gpu_lines(frame, "util_gpu", "n1", domain, overlay, 4000))
    legend = next(layer["encoding"]["color"]["legend"] for layer in _layers(spec)
                  if layer["encoding"]["color"].get("field") == "gpu")
    if gpus <= charts.LEGEND_MOST:
        assert legend["symbolLimit"] >= gpus and legend["title"] == "GPU"  # Vega's default stops at 30
    else:
        assert legend["symbolLimit"] == charts.LEGEND_MOST
        assert legend["title"] == f"GPU (first {charts.LEGEND_MOST} of {gpus})"
    # The element is tall enough for the GPUs' legend and the markers' under it (it showed 6 of 8).
    legends = (min(gpus, charts.LEGEND_MOST) * charts.LEGEND_ROW_PX
               + len(charts.MARKER_COLOURS.domain) * charts.MARKER_ROW_PX + 2 * charts.LEGEND_TITLE_PX)
    assert charts.gpu_lines_px(frame, "n1", overlay) >= legends


def _format(domain: charts.Domain) -> str:
    return str(_spec(charts.time_x(domain))["axis"]["format"])


def test_a_time_axis_that_crosses_midnight_shows_the_date() -> None:
    evening = dt.datetime(2024, 3, 4, 22, 0, tzinfo=dt.UTC)
    overnight = (evening, evening + dt.timedelta(hours=13))
    assert all(part in _format(overnight) for part in ("%b", "%d", "%H:%M"))
    assert _format((evening, evening + dt.timedelta(hours=1))) == "%H:%M"
    half_hour_at_midnight = (evening + dt.timedelta(hours=1, minutes=45), evening + dt.timedelta(hours=2, minutes=15))
    assert _format(half_hour_at_midnight) == "%H:%M"  # its few ticks minutes apart; its tooltips say the day
    assert _format((evening, evening + dt.timedelta(minutes=10))) == "%H:%M:%S"
    frame = _gpu_frame(2).assign(bucket=lambda f: f["bucket"] + pd.Timedelta(hours=13, minutes=55))
    spec = _spec(charts.gpu_heatmap(frame, overnight))
    assert {layer["encoding"]["x"]["axis"]["format"] for layer in spec["layer"]} == {charts.DAYS_TIME_FORMAT}


@pytest.fixture
def browser() -> Iterator[Any]:
    yield from headless_chromium(3000)


@pytest.mark.browser
def test_no_chart_of_the_job_page_is_squashed(browser: Any, seeded: Seed, database_url: str, tmp_path: Path) -> None:
    """In Chromium, every chart element of the seeded job page (all of its run) is at least a readable
    plot and its frame tall: the throughput chart was 160 pixels in all, its plot a 10-pixel strip."""
    from selenium.webdriver.common.by import By

    driver = browser
    least = charts.MIN_PLOT_PX + charts.CHART_FRAME_PX
    with Up(tmp_path / "data", tmp_path / "up.log", env={"JOBSIGHT_DATABASE_URL": database_url,
                                                         "JOBSIGHT_DASHBOARD_CLUSTER": seeded.cluster}) as up:
        drawn: Callable[[], list[Any]] = lambda: driver.find_elements(  # noqa: E731
            By.CSS_SELECTOR, '[data-testid="stVegaLiteChart"]')
        heights: list[int] = []
        # What the page always draws (heatmap, steps, throughput) and, a details section each, the nodes'
        # GPU lines and the training metrics.
        for details in ("nodes", "metrics"):
            query = urlencode({"cluster": seeded.cluster, "job": seeded.running, "window": "all", "details": details})
            driver.get(f"http://127.0.0.1:{up.dashboard_port}/job?{query}")
            _wait(lambda: len(drawn()) >= 4, 90, f"the job page's charts ({details})")
            _wait(lambda: not driver.find_elements(
                By.CSS_SELECTOR, '[data-testid="stStatusWidget"] [data-testid="stStatusWidgetRunningIcon"]'),
                30, "the script run to finish")
            shown = [element.size["height"] for element in drawn() if element.is_displayed()]
            driver.save_screenshot(str(tmp_path / f"job_page_{details}.png"))
            # The first is the heatmap, sized by its rows (two GPUs: 90 pixels and its frame) as before.
            assert len(shown) >= 4 and min(shown[1:]) >= least, [(e.location, e.size) for e in drawn()]
            heights += shown[1:]
        assert len(heights) >= 7  # steps, throughput and a node's lines; steps, throughput, loss and lr
        assert up.interrupt() == 0
