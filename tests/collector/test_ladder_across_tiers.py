"""The waste ladder of a 3-hour idle job on the default tiers: findings judge the window they claim
whichever tier holds it, so the hourly packing of closed hours neither closes nor reopens them.

Everything runs as the collector runs it, on a clock moved 5 minutes at a time: the node daemon's
samples and the prolog's registration through the ingest path (node tokens), the compaction pass
with the default ``JOBSIGHT_HOT_MINUTES``, the health evaluator with its default thresholds, and the
actions pass with docs/health.md's policy (warn at 30 min, again at 1 h, cancel at 2 h; a dry run). The
actions pass reads its clock from the database (``now()``): its connection's ``search_path`` puts a
``now()`` that returns the moved clock ahead of PostgreSQL's own, the rest of the server unchanged.
The passes run at a quarter second past the minute and the daemon samples at half past, as
unaligned timers do.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from jobsight.collector.config.actions import load_action_settings
from jobsight.collector.config.health import load_health_settings
from jobsight.collector.config.tiers import load_tier_settings
from jobsight.collector.passes.actions import WasteActions
from jobsight.collector.passes.findings import HealthEvaluator
from jobsight.collector.store.embedded_db import EmbeddedPostgres
from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.tiers import compaction
from jobsight.protocol.tokens import mint_node_token
from jobsight.protocol.wire import encode_batch
from tests.collector.helpers import SECRET, next_seq, post
from tests.conftest import own_database

S = 1_000_000
PASS_S = 300
"""The passes' interval: the compaction timer's default, and the evaluator's and actions' every 5th."""
SAMPLE_S = 10
RUN_S = 3 * 3600 + 15 * 60
"""Three hours and a quarter: past the action at 2 h after the finding opened, and three packings."""
SAMPLE_PHASE_S = 0.5
PASS_PHASE_S = 0.25
POLICY = {"name": "gpu-idle", "rule": "idle_allocation", "warn_after_s": 1800, "warn_again_after_s": 3600,
          "act_after_s": 7200, "action": "cancel", "dry_run": True}
"""docs/health.md's example policy, as a dry run: the ladder is recorded, no Slurm command runs."""


@pytest.fixture(scope="module")
def url(postgres: EmbeddedPostgres) -> Iterator[str]:
    """A database of its own: the compaction pass packs every job's closed hours, not just this one's."""
    yield from own_database(postgres, "ladder")


@pytest.fixture
def node_client(url: str, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The collector in-process with a cluster secret and its own passes off: the test runs them."""
    from fastapi.testclient import TestClient

    from jobsight.collector.app import create_app
    from jobsight.collector.config.settings import load_collector_settings

    for timer in ("COMPACT_INTERVAL_S", "HEALTH_INTERVAL_S", "ACTIONS_INTERVAL_S", "RECONCILE_INTERVAL_S"):
        monkeypatch.setenv(f"JOBSIGHT_{timer}", "0")
    secret_file = tmp_path / "cluster_secret"
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o600)
    settings = load_collector_settings(database_url=url, data_dir=data_dir, secret_file=secret_file)
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.fixture
def moved_clock(url: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    """A connection whose ``now()`` is the setting ``jobsight_test.now``, for the actions pass."""
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS moved_clock")
        conn.execute("""CREATE OR REPLACE FUNCTION moved_clock.now() RETURNS timestamptz LANGUAGE sql STABLE
                        AS $$ SELECT current_setting('jobsight_test.now')::timestamptz $$""")
        conn.execute("SET search_path = moved_clock, pg_catalog, public")
        yield conn


def _us(t: dt.datetime) -> int:
    return round(t.timestamp() * S)


def _samples(job: str, start: dt.datetime, end: dt.datetime) -> list[dict[str, Any]]:
    """The node daemon's samples of the job's two GPUs in [start, end): idle (0-2 %), 1 GiB used."""
    out = []
    t = start
    while t < end:
        for index in (0, 1):
            out.append({"kind": "gpu_sample", "job": job, "ts": _us(t), "node": "n1", "gpu_index": index,
                        "gpu_uuid": f"GPU-{index}", "gpu_name": "NVIDIA H100 80GB HBM3", "util_gpu": float(index * 2),
                        "mem_used": 2**30, "mem_total": 80 * 2**30, "power_w": 70.0, "lost": False})
        t += dt.timedelta(seconds=SAMPLE_S)
    return out


def _findings(conn: psycopg.Connection[dict[str, Any]], job: str, rule: str) -> list[dict[str, Any]]:
    return conn.execute("SELECT * FROM findings WHERE job_id = %s AND rule = %s ORDER BY id", (job, rule)).fetchall()


def test_a_three_hour_idle_job_is_warned_twice_then_acted_on_across_hourly_packing(
    node_client: Any, url: str, moved_clock: psycopg.Connection[dict[str, Any]], tmp_path: Path,
) -> None:
    job = str(700_000 + uuid.uuid4().int % 100_000)
    # Two days ago, seven minutes into an hour: the job's hours are packed one by one as the clock moves.
    start = compaction.hour_floor(dt.datetime.now(dt.UTC) - dt.timedelta(days=2)) + dt.timedelta(minutes=7)
    node = {"Authorization": f"Bearer {mint_node_token(SECRET, 'default', 'n1')}"}
    registered = {"kind": "job_started", "job": job, "ts": _us(start), "node": "n1", "user": "alice", "uid": 1001,
                  "account": "ml", "partition": "gpu", "nodes": ["n1"], "gpus": ["0", "1"], "batch": True}
    assert post(node_client, encode_batch("prolog", next_seq(), [registered]), **node).status_code == 200

    calls = tmp_path / "calls"
    script = tmp_path / "slurm-command"
    script.write_text(f'#!/bin/sh\necho "$(basename "$0") $*" >> {calls}\n')
    script.chmod(0o755)
    actions = WasteActions(load_action_settings(policies=[POLICY], scancel=str(script), scontrol=str(script),
                                                clusters=["default"]))
    health = HealthEvaluator(load_health_settings())
    tiers = load_tier_settings()
    packed_hours: set[dt.datetime] = set()
    open_over_time: list[tuple[float, set[str]]] = []
    sampled = start + dt.timedelta(seconds=SAMPLE_PHASE_S)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        for k in range(1, RUN_S // PASS_S + 1):
            now = start + dt.timedelta(seconds=k * PASS_S + PASS_PHASE_S)
            batch = _samples(job, sampled, now)
            sampled += dt.timedelta(seconds=SAMPLE_S * (len(batch) // 2))
            assert post(node_client, encode_batch("daemon-n1", next_seq(), batch), **node).status_code == 200
            report = compaction.run_pass(conn, PartitionKeeper(), older_than=tiers.older_than(),
                                         packed_retention_days=0, now=now)
            packed_hours.update(d.until for d in report.days)
            health.evaluate_once(conn, now.timestamp())
            moved_clock.execute("SELECT set_config('jobsight_test.now', %s, false)", (now.isoformat(),))
            actions.act_once(moved_clock)
            rows = conn.execute("SELECT rule FROM findings WHERE job_id = %s AND state = 'open'", (job,)).fetchall()
            open_over_time.append((now.timestamp() - start.timestamp(), {r["rule"] for r in rows}))

        # The hours were packed as they closed: the windows read the packed tier for most of the run.
        assert len(packed_hours) >= 3, packed_hours
        hot = conn.execute("SELECT min(ts) AS first FROM gpu_minutes WHERE job_id = %s", (job,)).fetchone()
        assert hot["first"] == compaction.hour_floor(now)

        [idle] = _findings(conn, job, "idle_allocation")
        [low] = _findings(conn, job, "low_utilisation")
        ladder = conn.execute("SELECT step, at, outcome, dry_run FROM actions WHERE job_id = %s ORDER BY id",
                              (job,)).fetchall()

    # One idle finding, opened once (at the first pass with 30 min of samples) and never resolved.
    opened_s = idle["opened_at"].timestamp() - start.timestamp()
    assert idle["state"] == "open" and idle["resolved_at"] is None
    assert opened_s == min(s for s, _ in open_over_time if s >= 1800 + SAMPLE_PHASE_S)
    assert all("idle_allocation" in rules for s, rules in open_over_time if s >= opened_s)
    # The idle stretch it judged at opening began with the earliest sample of its window, and the
    # evidence still says so after two hours of updates.
    assert idle["updated_at"] > idle["opened_at"] + dt.timedelta(hours=2)
    # (The window starts a quarter second into a minute, whose first sample comes a quarter second later.)
    window_start = idle["opened_at"].timestamp() - 1800
    assert idle["evidence"]["idle_since"] == pytest.approx(window_start + SAMPLE_PHASE_S - PASS_PHASE_S, abs=1e-6)

    # The ladder: warn, warn again, act, at 30 min, 1 h and 2 h after the finding opened; a dry run.
    assert [(a["step"], a["outcome"], a["dry_run"]) for a in ladder] == [
        ("warn", "recorded", True), ("warn_again", "recorded", True), ("act", "recorded", True)]
    assert [(a["at"] - idle["opened_at"]).total_seconds() for a in ladder] == [1800, 3600, 7200]
    assert not calls.exists()

    # Under 30 % on average from its first hour on: low_utilisation opened once and stays open.
    low_opened_s = low["opened_at"].timestamp() - start.timestamp()
    assert low["state"] == "open" and low_opened_s == min(s for s, _ in open_over_time if s >= 3600 + SAMPLE_PHASE_S)
    assert all("low_utilisation" in rules for s, rules in open_over_time if s >= low_opened_s)
    low_window_start = low["opened_at"].timestamp() - 3600
    assert low["evidence"]["idle_since"] == pytest.approx(low_window_start + SAMPLE_PHASE_S - PASS_PHASE_S, abs=1e-6)
