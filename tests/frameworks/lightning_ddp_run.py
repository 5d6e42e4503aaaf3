"""A real two-process Lightning DDP run on gloo (CPU) whose ``slow_rank`` does ``extra_s`` of
extra work in every training step (and from step ``hang_at`` on sleeps an hour), with a profile
window on every rank or none, shipped to a live collector: for the tests of what a slow or stuck
rank looks like (straggler diagnoses, health rules)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.frameworks.ddp_run import REPO, free_port

WORKER = r'''
import os, time
import torch
import lightning.pytorch as pl
from jobsight.agent.training.lightning import JobsightCallback

SLOW_RANK, EXTRA_S = int(os.environ["SLOW_RANK"]), float(os.environ["EXTRA_S"])
STEPS, HANG_AT, PROFILE = int(os.environ["STEPS"]), int(os.environ["HANG_AT"]), os.environ["PROFILE"] == "1"


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))

    def training_step(self, batch, batch_idx):
        if self.global_rank == SLOW_RANK:
            # This rank's own extra work, before backward: the others wait for it in the all-reduce.
            time.sleep(3600 if 0 <= HANG_AT <= batch_idx else EXTRA_S)
        (x,) = batch
        return self.net(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    data = torch.utils.data.TensorDataset(torch.randn(32 * STEPS, 256))
    schedule = {"wait": 1, "warmup": 1, "active": 3} if PROFILE else None
    callback = JobsightCallback(profile=schedule, profile_ranks=None, on_demand=False)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=STEPS, callbacks=[callback], logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
    )
    trainer.fit(Model(), torch.utils.data.DataLoader(data, batch_size=16))
'''


def start_lightning_ddp(
    live: Any, job_id: str, tmp_path: Path, *, slow_rank: int = 1, extra_s: float = 0.05, steps: int = 6,
    hang_at: int = -1, profile: bool = True, env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start :data:`WORKER` against ``live`` in a session of its own (kill the group to stop it);
    its output goes to ``tmp_path/run.log``. ``env``: more variables for it (agent settings)."""
    script = tmp_path / "lightning_ddp_worker.py"
    script.write_text(WORKER)
    env = {
        **os.environ, "JOBSIGHT_URL": live.url, "JOBSIGHT_TOKEN": live.token,
        "JOBSIGHT_JOB_ID": job_id, "JOBSIGHT_SPOOL_DIR": str(tmp_path / "spool"), "JOBSIGHT_BATCH_AGE_S": "0.1",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "PYTHONPATH": str(REPO),
        "SLOW_RANK": str(slow_rank), "EXTRA_S": str(extra_s), "STEPS": str(steps), "HANG_AT": str(hang_at),
        "PROFILE": "1" if profile else "0", **(env or {}),
    }
    with open(tmp_path / "run.log", "wb") as log:
        return subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def finish_lightning_ddp(run: subprocess.Popen[bytes], tmp_path: Path, timeout: float = 180) -> None:
    """Wait for a started run (killing its group if it outlives ``timeout``); fail on a bad exit."""
    try:
        code = run.wait(timeout=timeout)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    if code != 0:
        raise AssertionError(f"the DDP run failed ({code}):\n{(tmp_path / 'run.log').read_text()[-4000:]}")


def run_lightning_ddp(
    live: Any, job_id: str, tmp_path: Path, *, slow_rank: int = 1, extra_s: float = 0.05, steps: int = 6
) -> None:
    """Run :data:`WORKER` (2 ranks × ``steps`` steps, steps 2–4 profiled on both) against ``live``."""
    finish_lightning_ddp(start_lightning_ddp(live, job_id, tmp_path, slow_rank=slow_rank, extra_s=extra_s,
                                             steps=steps), tmp_path)
