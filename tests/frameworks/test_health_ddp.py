"""Live health findings from real 2-process Lightning DDP runs (gloo, CPU) against a real
collector whose evaluator runs every second with shortened thresholds: a rank that sleeps in a
step until the job is reported hung, a rank slowed until it is reported a straggler (the slow
one, though every rank's step time is alike), and a healthy run with no finding."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning.pytorch")

from jobsight.collector.embedded_db import free_port  # noqa: E402
from tests.conftest import LiveCollector  # noqa: E402
from tests.frameworks.support import api, wait_for  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

# SLOW_RANK sleeps SLOW_S in every training step; from step HANG_AT on it sleeps an hour.
WORKER = r'''
import os, time
import torch, lightning.pytorch as pl
from jobsight.agent.training.lightning import JobsightCallback

SLOW_RANK, SLOW_S = int(os.environ["SLOW_RANK"]), float(os.environ["SLOW_S"])
HANG_AT, STEPS = int(os.environ["HANG_AT"]), int(os.environ["STEPS"])

class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(64, 64)

    def training_step(self, batch, batch_idx):
        if self.global_rank == SLOW_RANK:
            time.sleep(3600 if 0 <= HANG_AT <= batch_idx else SLOW_S)
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

if __name__ == "__main__":
    data = torch.utils.data.TensorDataset(torch.randn(16 * STEPS, 64))
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         callbacks=[JobsightCallback()])
    trainer.fit(Model(), torch.utils.data.DataLoader(data, batch_size=8))
'''

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


def start_run(live: LiveCollector, job_id: str, tmp_path: Path, **knobs: Any) -> subprocess.Popen[bytes]:
    script = tmp_path / "health_worker.py"
    script.write_text(WORKER)
    env = {
        **os.environ, "JOBSIGHT_URL": live.url, "JOBSIGHT_TOKEN": live.token, "JOBSIGHT_JOB_ID": job_id,
        "JOBSIGHT_SPOOL_DIR": str(tmp_path / "spool"), "JOBSIGHT_BATCH_AGE_S": "0.1", "PYTHONPATH": str(REPO),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
        **{k: str(v) for k, v in {"SLOW_RANK": 1, "SLOW_S": 0.0, "HANG_AT": -1, "STEPS": 40, **knobs}.items()},
    }
    log = open(tmp_path / "run.log", "wb")
    return subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def finish(run: subprocess.Popen[bytes], tmp_path: Path, timeout: float = 180) -> None:
    try:
        code = run.wait(timeout=timeout)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert code == 0, (tmp_path / "run.log").read_text()[-3000:]


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
    run = start_run(health_collector, job_id, tmp_path, HANG_AT=20, STEPS=200)
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
    run = start_run(health_collector, job_id, tmp_path, SLOW_S=0.05, STEPS=120)
    straggler = wait_for(lambda: [f for f in findings(health_collector, job_id) if f["rule"] == "straggler"],
                         timeout=150, interval=1.0)
    finish(run, tmp_path)
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
    run = start_run(health_collector, job_id, tmp_path, STEPS=60)
    finish(run, tmp_path)
    # The job stays "running" until its end is reported (Slurm's epilog): its ranks, done after
    # their last step, are not called hung however long the evaluator looks.
    assert api(health_collector, f"/v1/jobs/{job_id}")["state"] == "running"
    time.sleep(8)
    assert findings(health_collector, job_id) == []
