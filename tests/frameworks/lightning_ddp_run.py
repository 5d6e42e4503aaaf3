"""A real two-process Lightning DDP run on gloo (CPU) whose ``slow_rank`` does ``extra_s`` of
extra work in every training step, with a profile window on every rank, shipped to a live
collector: for the tests of what a slow rank looks like (straggler diagnoses, health rules)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.frameworks.ddp_run import REPO, free_port

WORKER = r'''
import os, time
import torch
import lightning.pytorch as pl
from jobsight.agent.training.lightning import JobsightCallback

SLOW_RANK, EXTRA_S = int(os.environ["SLOW_RANK"]), float(os.environ["EXTRA_S"])
STEPS = int(os.environ["STEPS"])


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))

    def training_step(self, batch, batch_idx):
        if self.global_rank == SLOW_RANK:
            time.sleep(EXTRA_S)  # this rank's own extra work, before backward: the others wait for it
        (x,) = batch
        return self.net(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    data = torch.utils.data.TensorDataset(torch.randn(32 * STEPS, 256))
    callback = JobsightCallback(profile={"wait": 1, "warmup": 1, "active": 3}, profile_ranks=None, on_demand=False)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=STEPS, callbacks=[callback], logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
    )
    trainer.fit(Model(), torch.utils.data.DataLoader(data, batch_size=16))
'''


def run_lightning_ddp(
    live: Any, job_id: str, tmp_path: Path, *, slow_rank: int = 1, extra_s: float = 0.05, steps: int = 6
) -> None:
    """Run :data:`WORKER` (2 ranks × ``steps`` steps, steps 2–4 profiled on both) against ``live``."""
    script = tmp_path / "lightning_ddp_worker.py"
    script.write_text(WORKER)
    env = {
        **os.environ, "JOBSIGHT_URL": live.url, "JOBSIGHT_TOKEN": live.token,
        "JOBSIGHT_JOB_ID": job_id, "JOBSIGHT_SPOOL_DIR": str(tmp_path / "spool"), "JOBSIGHT_BATCH_AGE_S": "0.1",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "PYTHONPATH": str(REPO),
        "SLOW_RANK": str(slow_rank), "EXTRA_S": str(extra_s), "STEPS": str(steps),
    }
    done = subprocess.run([sys.executable, str(script)], env=env, timeout=180, cwd=tmp_path, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise AssertionError(f"the DDP run failed ({done.returncode}):\n{done.stderr[-4000:]}")
