"""Live health findings from real 2-process Lightning DDP runs (gloo, CPU) against a real
collector whose evaluator runs every second with shortened thresholds: a rank that sleeps in a
step until the job is reported hung, named from where each rank says it is (not the rank that
only waits for it in the all-reduce, either way round), a rank slowed until it is reported a
straggler (the slow one, though every rank's step time is alike), and a healthy run with no
finding."""

from __future__ import annotations

import os
import signal
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning.pytorch")

from tests.conftest import LiveCollector  # noqa: E402
from tests.frameworks.lightning_ddp_run import finish_lightning_ddp, start_lightning_ddp  # noqa: E402
from tests.frameworks.support import api, wait_for  # noqa: E402

HEALTH_ENV = {
    "JOBSIGHT_HEALTH_INTERVAL_S": "1", "JOBSIGHT_HEALTH_HUNG_MIN_S": "4", "JOBSIGHT_HEALTH_HUNG_FACTOR": "10",
    "JOBSIGHT_HEALTH_STRAGGLER_WINDOW_S": "600", "JOBSIGHT_HEALTH_STRAGGLER_MIN_STEPS": "5",
}
AGENT_ENV = {"JOBSIGHT_PHASE_REPORT_S": "1"}
"""A phase that lasts a second is reported (30 s by default), well inside the 4 s hung threshold."""


@pytest.fixture
def health_collector(database_url: str, data_dir: Path, admin_token: str, tmp_path: Path) -> Iterator[LiveCollector]:
    collector = LiveCollector(database_url, data_dir, admin_token, tmp_path / "collector.log", env=HEALTH_ENV)
    collector.start()
    yield collector
    collector.kill()


def findings(live: LiveCollector, job_id: str) -> list[dict[str, Any]]:
    """The job's findings; none while the collector has not seen the job yet (404)."""
    try:
        return list(api(live, f"/v1/jobs/{job_id}/findings")["findings"])
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return []
        raise


@pytest.mark.parametrize("slow_rank", [1, 0])
def test_the_rank_asleep_in_its_step_is_named_not_the_one_waiting_for_it(
    health_collector: LiveCollector, job_id: str, tmp_path: Path, slow_rank: int
) -> None:
    waiting = 1 - slow_rank
    run = start_lightning_ddp(health_collector, job_id, tmp_path, slow_rank=slow_rank, extra_s=0.0, hang_at=20,
                              steps=200, profile=False, env=AGENT_ENV)
    try:
        # The sleeping rank says it is in its forward pass, the other that it waits in backward
        # (its gradient all-reduce); the finding that opens names the sleeper.
        hung = wait_for(lambda: [f for f in findings(health_collector, job_id) if f["rule"] == "hung_rank"
                                 and f["rank"] == slow_rank], timeout=150, interval=1.0)
        time.sleep(3)  # a few more evaluations: no straggler appears for the waiting rank
        found = findings(health_collector, job_id)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    finding = hung[0]
    assert finding["state"] == "open" and finding["severity"] == "critical"
    # Neither rank steps: one finding for the whole job, naming the rank the other waits for.
    assert finding["subject"] == "" and finding["title"] == "Job looks hung"
    assert finding["evidence"]["behind"] == [slow_rank] and finding["evidence"]["waiting"] == [waiting]
    phases = finding["evidence"]["phases"]
    assert phases[str(slow_rank)]["phase"] == "forward" and phases[str(waiting)]["phase"] == "backward"
    assert phases["0"]["step"] == phases["1"]["step"] == 20
    message = finding["message"]
    assert f"rank {slow_rank} is still in the forward pass of step 20" in message
    assert f"rank {waiting} is in backward of step 20" in message and "stopped first" not in message
    ranks = finding["evidence"]["ranks"]
    assert set(ranks) == {"0", "1"}
    assert all(r["silent_s"] >= 4 for r in ranks.values())
    assert finding["at_ts"] is not None
    assert [f["rule"] for f in found] == ["hung_rank"], "opened once, updated after; no straggler"


def test_a_slowed_rank_is_reported_a_straggler(health_collector: LiveCollector, job_id: str, tmp_path: Path) -> None:
    run = start_lightning_ddp(health_collector, job_id, tmp_path, extra_s=0.05, steps=120, profile=False)
    straggler = wait_for(lambda: [f for f in findings(health_collector, job_id) if f["rule"] == "straggler"],
                         timeout=150, interval=1.0)
    finish_lightning_ddp(run, tmp_path)
    evidence = straggler[0]["evidence"]
    assert straggler[0]["rank"] == 1 and straggler[0]["subject"] == "rank 1"
    # Compared on the work outside the all-reduce: rank 1's forward holds the 50 ms sleep.
    assert evidence["compared"] == "data_wait_s + forward_s"
    assert evidence["by_rank_s"]["1"] >= 0.05 > evidence["by_rank_s"]["0"]
    # Their step times are alike: rank 0 waits for rank 1 at every step.
    steps = evidence["step_s_by_rank"]
    assert abs(steps["0"] - steps["1"]) < 0.5 * steps["1"]
    assert not [f for f in findings(health_collector, job_id) if f["rule"] == "hung_rank"]
    # Both ranks said their fit ended: the straggler is resolved, and nobody is called hung.
    wait_for(lambda: all(f["state"] == "resolved" for f in findings(health_collector, job_id)), timeout=30)
    time.sleep(6)  # past the shortened hung threshold (4 s) and several evaluations
    assert [f["rule"] for f in findings(health_collector, job_id)] == ["straggler"]


def test_a_healthy_run_has_no_finding(health_collector: LiveCollector, job_id: str, tmp_path: Path) -> None:
    run = start_lightning_ddp(health_collector, job_id, tmp_path, extra_s=0.0, steps=60, profile=False,
                              env=AGENT_ENV)
    finish_lightning_ddp(run, tmp_path)
    # The job stays "running" until its end is reported (Slurm's epilog): its ranks, done after
    # their last step, are not called hung however long the evaluator looks.
    assert api(health_collector, f"/v1/jobs/{job_id}")["state"] == "running"
    time.sleep(8)
    assert findings(health_collector, job_id) == []
