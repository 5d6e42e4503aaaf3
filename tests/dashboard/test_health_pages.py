"""Health findings on the dashboard, through Streamlit's AppTest over the session database: the job
page's banner (evidence, a link to the moment, the history), the jobs list's health column, and the
admins' Attention page.

The findings are rows written with SQL, as ``collector/passes/findings.py`` stores them, on a cluster of
their own (so the seeded cluster's figures do not change):

| job     | user  | state     | findings                                                         |
| h-hung  | alice | running   | open critical ``hung_rank`` rank 1, open warning ``low_utilisation``, |
|         |       |           | resolved ``straggler``                                           |
| h-clean | alice | completed | none                                                             |
| h-slow  | bob   | running   | open warning ``straggler`` rank 0 (no ``at_ts``: its moment is when it opened) |

``h-hung`` has 20 minutes of 1 Hz samples on two GPUs and steps on two ranks; rank 1 stops after 12.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import pandas as pd
import psycopg
import pytest
from psycopg.types.json import Jsonb
from streamlit import dataframe_util
from streamlit.testing.v1 import AppTest

from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.store.schema import PARTITIONED_TABLES
from jobsight.collector.tiers.rollup import rebuild_minutes
from jobsight.collector.tiers.step_rollup import rebuild as rebuild_steps
from jobsight.dashboard.views import job_health
from jobsight.rules import display_text
from tests.dashboard import drawn_heatmap
from tests.dashboard.conftest import texts
from tests.dashboard.seed import Seed

UTC = dt.UTC
HUNG_TITLE = "Rank 1 has stopped stepping"
LOW_TITLE = "Low GPU utilisation"
SLOW_TITLE = "Rank 0 is a straggler"
OLD_TITLE = "Rank 1 was a straggler"


@dataclass(frozen=True)
class Health:
    cluster: str
    hung: str
    clean: str
    slow: str
    start: dt.datetime
    """When ``hung`` started."""
    stopped: dt.datetime
    """Rank 1's last step: the hung finding's ``at_ts``."""
    slow_opened: dt.datetime


def _finding(conn: psycopg.Connection[Any], cluster: str, job: str, rule: str, subject: str, rank: int | None,
             severity: str, opened: dt.datetime, at: dt.datetime | None, title: str, message: str,
             evidence: dict[str, Any], resolved: dt.datetime | None = None) -> None:
    conn.execute(
        """INSERT INTO findings (cluster, job_id, rule, subject, rank, node, severity, state, opened_at, updated_at,
                                 resolved_at, at_ts, title, message, evidence)
           VALUES (%s, %s, %s, %s, %s, 'n1', %s, %s, %s, %s, %s, %s, %s, %s, %s)""",
        (cluster, job, rule, subject, rank, severity, "open" if resolved is None else "resolved", opened,
         resolved or opened, resolved, at, title, message, Jsonb(evidence)),
    )


def _seed(database_url: str) -> Health:
    cluster = f"health-{uuid.uuid4().hex[:8]}"
    now = dt.datetime.now(UTC).replace(microsecond=0)
    start = now - dt.timedelta(minutes=20)
    stopped = start + dt.timedelta(seconds=719)
    h = Health(cluster, "h-hung", "h-clean", "h-slow", start, stopped, now - dt.timedelta(minutes=5))
    with psycopg.connect(database_url, autocommit=True) as conn:
        keeper = PartitionKeeper()
        for table in PARTITIONED_TABLES:
            keeper.ensure(conn, table, {start.date(), now.date()})
        with conn.transaction():
            for job, user, end, name in ((h.hung, "alice", None, "pretrain"), (h.clean, "alice", start, "eval"),
                                         (h.slow, "bob", None, "sweep")):
                conn.execute(
                    """INSERT INTO jobs (cluster, job_id, user_name, account, partition, name, nodes, node_count,
                                         gpus, start_time, end_time, state, last_seen)
                       VALUES (%s, %s, %s, 'ml', 'gpu', %s, '{n1}', 1, '{n1:0,n1:1}', %s, %s, %s, %s)""",
                    (cluster, job, user, name, start - dt.timedelta(hours=1) if end else start, end,
                     "completed" if end else "running", end or now),
                )
            params = {"c": cluster, "j": h.hung, "s": start}
            conn.execute(
                """INSERT INTO gpu_samples (cluster, job_id, ts, node, gpu_index, gpu_uuid, gpu_name, util_gpu,
                                            mem_used, mem_total, power_w, temp_c, lost)
                   SELECT %(c)s, %(j)s, %(s)s + make_interval(secs => t), 'n1', g, 'GPU-h' || g, 'NVIDIA H100',
                          CASE WHEN t < 720 THEN 90 ELSE 2 END, 20 * 2^30, 80 * 2^30, 300, 55, false
                   FROM generate_series(0, 1199) t, generate_series(0, 1) g""", params)
            rebuild_minutes(conn, cluster, h.hung)
            conn.execute(
                """INSERT INTO steps (cluster, job_id, ts, node, rank, pid, step, epoch, phase, duration_s,
                                      data_wait_s, compute_s, samples)
                   SELECT %(c)s, %(j)s, %(s)s + make_interval(secs => t), 'n1', r, 1000 + r, t, 0, 'train', 0.5,
                          0.05, 0.4, 32
                   FROM generate_series(0, 1199) t, generate_series(0, 1) r WHERE r = 0 OR t < 720""", params)
            rebuild_steps(conn, cluster, h.hung)
            evidence = {"ranks": {"0": {"last_step_at": now.timestamp() - 1, "silent_s": 1.0, "median_step_s": 0.5},
                                  "1": {"last_step_at": stopped.timestamp(), "silent_s": 480.0,
                                        "median_step_s": 0.5}},
                        "gpu_util_recent": 2.0, "gpu_power_recent_w": 61.5, "rank": 1, "silent_s": 480.0,
                        "median_step_s": 0.5, "threshold_s": 120.0}
            _finding(conn, cluster, h.hung, "low_utilisation", "", None, "warning", now - dt.timedelta(minutes=3),
                     None, LOW_TITLE, "The job's 2 GPUs averaged 24.0 % utilisation over the last 60 min.",
                     {"mean_util": 24.0, "gpus": 2})
            _finding(conn, cluster, h.hung, "hung_rank", "rank 1", 1, "critical", stopped + dt.timedelta(minutes=2),
                     stopped, HUNG_TITLE, "Rank 1 has made no step for 8 min, 960× its usual 0.50 s, while the "
                     "other ranks go on.", evidence)
            _finding(conn, cluster, h.hung, "straggler", "rank 1", 1, "warning", start + dt.timedelta(minutes=2),
                     None, OLD_TITLE, "Rank 1's own work per step was 1.6× the other ranks'.", {"ratio": 1.6},
                     resolved=start + dt.timedelta(minutes=6))
            _finding(conn, cluster, h.slow, "straggler", "rank 0", 0, "warning", h.slow_opened, None, SLOW_TITLE,
                     "Rank 0's own work per step is 1.4× the other ranks'.", {"ratio": 1.4})
    return h


@pytest.fixture(scope="module")
def health_seed(database_url: str) -> Health:
    return _seed(database_url)


@pytest.fixture
def health(dashboard_env: Seed, health_seed: Health, monkeypatch: pytest.MonkeyPatch) -> Iterator[Health]:
    """The dashboard limited to the health cluster (``app_as`` reads the settings when it runs)."""
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_CLUSTER", health_seed.cluster)
    yield health_seed


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def _iso(moment: dt.datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _x_start(spec: str) -> dt.datetime | None:
    """Where a chart's time axis starts: its x scale's fixed domain (epoch milliseconds or ISO 8601)."""
    def find(node: Any) -> Any:
        if isinstance(node, dict):
            x = node.get("x")
            domain = (x.get("scale") or {}).get("domain") if isinstance(x, dict) else None
            if domain:
                return domain[0]
            return next((found for child in node.values() if (found := find(child)) is not None), None)
        if isinstance(node, list):
            return next((found for child in node if (found := find(child)) is not None), None)
        return None

    start = find(json.loads(spec))
    if start is None:
        return None
    if isinstance(start, int | float):
        return dt.datetime.fromtimestamp(start / 1000, UTC)
    return dt.datetime.fromisoformat(str(start)).astimezone(UTC)


def _in_order(at: AppTest) -> list[tuple[str, str]]:
    """Every alert box of the page as (kind, text), in the order the page shows them."""
    found: list[tuple[str, str]] = []

    def walk(node: Any) -> None:
        if getattr(node, "type", None) in ("error", "warning", "info", "success"):
            found.append((node.type, str(node.value)))
        for child in getattr(node, "children", {}).values():
            walk(child)

    walk(at.main)
    return found


def _datasets(chart: Any) -> dict[str, pd.DataFrame]:
    """A chart's data sets: ``at`` for the rule; ``bucket`` for the series (the heatmap's cells as drawn)."""
    frames = [dataframe_util.convert_arrow_bytes_to_pandas_df(d.data.data) for d in chart.datasets]
    found = {"at": next(f for f in frames if "at" in f.columns)}
    if any("url" in f.columns for f in frames):
        found["bucket"] = drawn_heatmap.cells(frames)
    else:
        found["bucket"] = next(f for f in frames if "bucket" in f.columns)
    return found


def _timeline_links(at: AppTest) -> list[Any]:
    return [p.proto for p in at.get("page_link") if "in the timeline" in p.proto.label]


def test_banner_shows_the_hung_finding_first_with_its_evidence_and_timeline_link(
        app_as: Callable[..., AppTest], health: Health, database_url: str) -> None:
    at = app_as("alice", "views/job.py", cluster=health.cluster, job=health.hung)
    _ok(at)
    boxes = [(kind, text) for kind, text in _in_order(at) if "Open since" in text]
    assert [kind for kind, _ in boxes] == ["error", "warning"]  # the critical one first, in error style
    assert HUNG_TITLE in boxes[0][1] and "960× its usual 0.50 s" in boxes[0][1]
    assert LOW_TITLE in boxes[1][1]
    # The evidence and the history are drawn when opened, not with the page.
    assert not at.dataframe
    assert [e.label for e in at.expander] == ["Evidence", "Evidence", "History: 1 resolved finding(s)"]
    with psycopg.connect(database_url) as conn:
        hung = conn.execute("SELECT id FROM findings WHERE cluster = %s AND title = %s",
                            (health.cluster, HUNG_TITLE)).fetchone()
    assert hung is not None
    at.session_state[job_health.evidence_key({"id": hung[0]})] = True
    at.session_state[job_health.HISTORY_KEY] = True
    at.run()
    _ok(at)
    evidence = next(d.value for d in at.dataframe if list(d.value.columns) == ["name", "value"]).set_index("name")
    assert evidence.loc["rank 1 › silent (s)", "value"] == "480"  # ranks.1.silent_s, in words
    assert evidence.loc["rank 1 › last step at", "value"] == f"{health.stopped:%Y-%m-%d %H:%M:%S} UTC"
    assert evidence.loc["gpu power recent (W)", "value"] == "61.5"
    assert not any(display_text.SNAKE_CASE.search(name) for name in evidence.index)
    links = _timeline_links(at)
    assert len(links) == 2
    assert links[0].label == f"Show {health.stopped:%H:%M:%S} UTC in the timeline"
    assert parse_qs(links[0].query_string) == {"cluster": [health.cluster], "job": [health.hung],
                                               "t": [_iso(health.stopped)]}
    history = [e for e in at.expander if e.label.startswith("History")]
    assert [e.label for e in history] == ["History: 1 resolved finding(s)"]
    assert OLD_TITLE in history[0].dataframe[0].value.to_csv()
    assert OLD_TITLE not in "\n".join(text for _, text in boxes)  # resolved: history only, not the banner


def test_timeline_link_opens_the_window_around_the_moment(app_as: Callable[..., AppTest], health: Health) -> None:
    at = app_as("alice", "views/job.py", cluster=health.cluster, job=health.hung)
    charts_before = len(at.get("vega_lite_chart"))
    assert "Around" not in texts(at)
    link = _timeline_links(at)[0]
    at.query_params.update({k: v[0] for k, v in parse_qs(link.query_string).items()})
    at.run()
    _ok(at)
    assert f"Around {health.stopped:%Y-%m-%d %H:%M:%S} UTC" in [s.value for s in at.subheader]
    charts = at.get("vega_lite_chart")
    assert len(charts) == charts_before + 2  # the window's heatmap and step chart, the run's charts stay
    window_start = health.stopped - dt.timedelta(minutes=10)
    windowed = [c.proto for c in charts if _x_start(c.proto.spec) == window_start]
    assert len(windowed) == 2  # both drawn on the window's axis, starting ten minutes before the moment
    heatmap, steps = (_datasets(chart) for chart in windowed)
    for frames in (heatmap, steps):
        assert list(frames["at"]["at"]) == [health.stopped]  # the red rule
    cells = heatmap["bucket"]
    assert cells["bucket"].min() >= window_start  # read for the window, not the whole run
    quiet = cells.loc[cells["bucket"] > health.stopped, "rgba"]
    assert not quiet.empty and set(quiet) == {drawn_heatmap.colour(2.0)}  # the GPUs went quiet
    ranks = steps["bucket"]
    assert ranks.loc[ranks["rank"] == 1, "bucket"].max() <= health.stopped  # rank 1's steps end there
    assert ranks.loc[ranks["rank"] == 0, "bucket"].max() > health.stopped + dt.timedelta(minutes=5)


def test_job_without_findings_shows_no_banner(app_as: Callable[..., AppTest], health: Health) -> None:
    at = app_as("alice", "views/job.py", cluster=health.cluster, job=health.clean)
    _ok(at)
    assert f"Job {health.clean}" in texts(at)
    assert not [text for _, text in _in_order(at) if "Open since" in text]
    assert not _timeline_links(at)
    assert not [e for e in at.expander if e.label.startswith("History") or e.label == "Evidence"]


def test_jobs_list_health_column_marks_each_job(app_as: Callable[..., AppTest], health: Health) -> None:
    at = app_as("alice")
    at.selectbox(key="jobs_range").set_value("all time").run()
    _ok(at)
    table = at.dataframe[0].value.set_index("job")
    assert table.loc[health.hung, "health"] == "● hung, ▲ low util"
    assert table.loc[health.clean, "health"] == "ok"
    assert health.slow not in table.index
    at = app_as("bob")
    _ok(at)
    assert at.dataframe[0].value.set_index("job").loc[health.slow, "health"] == "▲ straggler"


def test_attention_lists_the_open_findings_for_an_admin(app_as: Callable[..., AppTest], health: Health) -> None:
    at = app_as("root", "views/attention.py")
    _ok(at)
    table = at.dataframe[0].value
    assert list(table["title"]) == [HUNG_TITLE, LOW_TITLE, SLOW_TITLE]  # critical first, then newest first
    assert OLD_TITLE not in texts(at)  # resolved
    hung = table.iloc[0]
    assert (hung["job"], hung["user"], hung["account"], hung["partition"], hung["rule"], hung["subject"]) == (
        health.hung, "alice", "ml", "gpu", "hung", "rank 1")  # the rule in words, as on the job page
    assert hung["severity"] == "● critical"
    assert hung["open"] == f"job?cluster={health.cluster}&job={health.hung}&t={_iso(health.stopped)}"
    slow = table.iloc[2]
    assert slow["user"] == "bob" and slow["open"].endswith(f"&t={_iso(health.slow_opened)}")  # no at_ts
    assert {m.label: m.value for m in at.metric} == {"Critical": "1", "Warning": "2", "Info": "0"}
    at.selectbox(key="attention_rule").set_value("straggler").run()
    _ok(at)
    assert list(at.dataframe[0].value["job"]) == [health.slow]
    at.selectbox(key="attention_rule").set_value("any")
    at.selectbox(key="attention_severity").set_value("critical").run()
    _ok(at)
    assert list(at.dataframe[0].value["title"]) == [HUNG_TITLE]


def test_attention_is_not_registered_for_a_user(app_as: Callable[..., AppTest], health: Health) -> None:
    at = app_as("alice")
    _ok(at)
    with pytest.raises(ValueError, match="Could not find a navigation page"):
        at.switch_page("views/attention.py")
    admin = app_as("root", "views/attention.py")  # the same page is there for an admin
    assert [t.value for t in admin.title] == ["Attention"]
