"""The simulated job's story gives the health rules theirs: a straggler only forward time shows,
then a hang in which the slow rank stops first while its GPU idles with its memory held; and the
simulated cluster ships it all, through the real shippers, to a real collector."""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from jobsight.agent.settings import AgentSettings
from jobsight.collector.config.health import load_health_settings
from jobsight.collector.passes.findings import HealthEvaluator
from jobsight.collector.store import migrate
from jobsight.commands.demo_cluster import SimulatedCluster
from jobsight.commands.demo_settings import load_demo_settings
from jobsight.commands.demo_story import CLUSTER, NODES, RANKS, SLOW_RANK, SimulatedRun, Timings
from jobsight.protocol.diagnosis import stragglers
from jobsight.rules.health import HealthThresholds, JobHealthInput, RankSteps, evaluate
from tests.conftest import LiveCollector

START = 1_800_000_000.0
TIMINGS = Timings(healthy_s=60, straggler_s=120, time_limit_s=600, step_s=0.5)


def _steps(run: SimulatedRun, until: float) -> list[dict[str, Any]]:
    return [r for _, r in run.records_until(until) if r["kind"] == "step"]


def _means(steps: list[dict[str, Any]], field: str) -> dict[int, float]:
    by_rank: dict[int, list[float]] = defaultdict(list)
    for s in steps:
        by_rank[s["rank"]].append(s[field])
    return {rank: statistics.fmean(values) for rank, values in by_rank.items()}


def test_every_rank_waits_for_the_straggler_and_only_forward_time_tells_it_apart() -> None:
    run = SimulatedRun("sim-t", START, TIMINGS)
    healthy = _steps(run, START + TIMINGS.healthy_s)
    _steps(run, START + TIMINGS.healthy_s + 60)  # the slow GPU heats up over a minute
    straggling = _steps(run, run.hang_s)
    assert len(_means(healthy, "duration_s")) == len(_means(straggling, "duration_s")) == RANKS
    assert stragglers(_means(healthy, "forward_s")) == [] and stragglers(_means(healthy, "duration_s")) == []
    # Synchronous data parallelism: every rank's step takes as long as the slowest rank's...
    durations = _means(straggling, "duration_s")
    assert stragglers(durations) == []
    assert max(durations.values()) / min(durations.values()) < 1.01
    assert min(durations.values()) > 1.3 * max(_means(healthy, "duration_s").values())
    # ...and the slow rank is the one whose own work grew.
    assert stragglers(_means(straggling, "forward_s")) == [SLOW_RANK]


def test_the_slow_rank_hangs_first_with_its_gpu_idle_and_its_memory_held() -> None:
    run = SimulatedRun("sim-t", START, TIMINGS)
    steps = _steps(run, run.end_s)
    last = {rank: max(s["ts"] for s in steps if s["rank"] == rank) / 1e6 for rank in range(RANKS)}
    assert last[SLOW_RANK] < min(t for rank, t in last.items() if rank != SLOW_RANK)
    assert max(last.values()) < run.hang_s + 3  # the others' host side ran one step ahead, then blocked too
    assert run.records_until(run.end_s + 60) == []
    loads = run.loads(run.hang_s + 30)
    assert loads[SLOW_RANK].util == 0 and loads[SLOW_RANK].mem_used > 50 * 1024**3 and loads[SLOW_RANK].pids
    others = [load for rank, load in enumerate(loads) if rank != SLOW_RANK]
    assert all(load.util >= 95 and (load.sm_active or 100) < 5 for load in others)  # spinning in the all-reduce
    assert run.loads(run.hang_s - 30)[SLOW_RANK].throttled


def test_the_hung_rank_rule_points_at_the_slow_rank() -> None:
    run = SimulatedRun("sim-t", START, TIMINGS)
    steps = _steps(run, run.end_s)
    now = run.hang_s + 300
    ranks = [RankSteps(rank, max(s["ts"] for s in steps if s["rank"] == rank) / 1e6,
                       statistics.median(s["duration_s"] for s in steps if s["rank"] == rank))
             for rank in range(RANKS)]
    [finding] = evaluate(JobHealthInput("sim-t", now, True, ranks), HealthThresholds(), ["hung_rank"])
    assert finding.rule == "hung_rank" and finding.at == next(r.last_step_at for r in ranks if r.rank == SLOW_RANK)


def test_the_simulated_cluster_ships_the_story_and_the_collector_finds_the_hang(
    empty_database_url: str, data_dir: Path, admin_token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its own database, as the evaluator judges every running job it finds; the collector's own
    evaluator is off, so that this test's evaluation is the one that opens the findings."""
    monkeypatch.setenv("JOBSIGHT_HEALTH_INTERVAL_S", "0")
    migrate.upgrade(empty_database_url)
    collector = LiveCollector(empty_database_url, data_dir, admin_token, tmp_path / "collector.log")
    collector.start()
    settings = load_demo_settings(healthy_s=20, straggler_s=40, time_limit_s=600, headstart_s=100)
    agent = AgentSettings(url=collector.url, token=admin_token, data_dir=str(tmp_path / "agent"))
    now = time.time()
    try:
        cluster = SimulatedCluster(agent, settings, clock=lambda: now)
        run = cluster.start_run("sim-test", now - settings.headstart_s)
        cluster.catch_up(run, now)
        assert cluster.close()
        with psycopg.connect(empty_database_url, row_factory=dict_row, autocommit=True) as conn:
            job = conn.execute("SELECT * FROM jobs WHERE cluster = %s AND job_id = 'sim-test'", (CLUSTER,)).fetchone()
            assert job is not None and job["demo"] and job["name"].startswith("simulated: ")
            assert job["nodes"] == list(NODES) and len(job["gpus"]) == 16 and job["state"] == "running"
            gpus = conn.execute("SELECT count(DISTINCT (node, gpu_index)) AS n, count(*) AS samples FROM gpu_samples "
                                "WHERE job_id = 'sim-test'").fetchone()
            assert gpus is not None and gpus["n"] == 16
            assert gpus["samples"] % 16 == 0 and 99 <= gpus["samples"] // 16 <= 101  # 1 Hz for the 100 s head start
            ranks = conn.execute("SELECT count(DISTINCT rank) AS n, bool_and(forward_s IS NOT NULL) AS forward "
                                 "FROM steps WHERE job_id = 'sim-test'").fetchone()
            assert ranks is not None and ranks["n"] == RANKS and ranks["forward"]
            health = HealthEvaluator(load_health_settings(hung_min_s=15, straggler_window_s=120))
            result = health.evaluate_once(conn, now=now)
            opened = {(f["rule"], f["subject"]): f for f in result.opened}
            assert ("hung_rank", "") in opened, opened
            assert opened[("hung_rank", "")]["at_ts"].timestamp() == pytest.approx(run.hang_s, abs=1.0)
            # The ranks said where they stay (30 s into the hang): the slow one in its forward pass.
            assert f"rank {SLOW_RANK} is still in the forward pass" in opened[("hung_rank", "")]["message"]
            assert opened[("hung_rank", "")]["evidence"]["behind"] == [SLOW_RANK]
            assert ("straggler", f"rank {SLOW_RANK}") in opened
            # Why: its GPU (node 2, GPU 3) ran throttled and hot, which its samples say.
            straggler = opened[("straggler", f"rank {SLOW_RANK}")]
            assert straggler["gpu"] == f"{NODES[1]}/3", straggler
            assert straggler["evidence"]["cause"]["kind"] == "clocks", straggler["evidence"]
            assert "thermal slowdown" in straggler["message"] and "MHz against" in straggler["message"]
    finally:
        collector.kill()
