"""Live health findings from real 2-process Lightning DDP runs (gloo, CPU) against a real
collector whose evaluator runs every second with shortened thresholds: a rank that sleeps in a
step until the job is reported hung, a rank slowed until it is reported a straggler (the slow
one, though every rank's step time is alike), and a healthy run with no finding."""

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


def test_a_rank_asleep_in_a_step_is_reported_hung(health_collector: LiveCollector, job_id: str,
                                                   tmp_path: Path) -> None:
    run = start_lightning_ddp(health_collector, job_id, tmp_path, extra_s=0.0, hang_at=20, steps=200,
                              profile=False)
    try:
        hung = wait_for(lambda: [f for f in findings(health_collector, job_id) if f["rule"] == "hung_rank"],
                        timeout=150, interval=1.0)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    finding = hung[0]
    assert finding["state"] == "open" and finding["severity"] == "critical"
    # Rank 0 waits for rank 1 in the all-reduce, so neither steps: the whole job looks hung.
    assert finding["subject"] == "" and finding["title"] == "Job looks hung"
    ranks = finding["evidence"]["ranks"]
    assert set(ranks) == {"0", "1"}
    assert all(r["silent_s"] >= 4 for r in ranks.values())
    assert finding["at_ts"] is not None
    assert len(hung) == 1, "opened once, updated after"
    assert not [f for f in findings(health_collector, job_id) if f["rule"] == "straggler"]


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
    run = start_lightning_ddp(health_collector, job_id, tmp_path, extra_s=0.0, steps=60, profile=False)
    finish_lightning_ddp(run, tmp_path)
    # The job stays "running" until its end is reported (Slurm's epilog): its ranks, done after
    # their last step, are not called hung however long the evaluator looks.
    assert api(health_collector, f"/v1/jobs/{job_id}")["state"] == "running"
    time.sleep(8)
    assert findings(health_collector, job_id) == []
