"""The job the real-Slurm end-to-end submits: a tiny Lightning fit with the jobsight callback.

Run by ``sbatch`` with the repo venv's python. It prints what the test checks against
(the GPUs Slurm gave the job and the jobsight variables the task prolog exported),
logs a line through the callback's log handler and profiles a few steps.
"""

from __future__ import annotations

import logging
import os
import sys

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from jobsight.agent.training.lightning import JobsightCallback

log = logging.getLogger("e2e.train")


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        if batch_idx == 0:
            log.info("hello from e2e job %s", os.environ.get("SLURM_JOB_ID"))
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> int:
    for name in ("SLURM_JOB_ID", "SLURM_JOB_GPUS", "JOBSIGHT_URL", "JOBSIGHT_JOB_ID", "JOBSIGHT_TOKEN"):
        print(f"{name}={os.environ.get(name, '')}", flush=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
    trainer = pl.Trainer(
        max_steps=int(os.environ.get("E2E_STEPS", "40")), accelerator="cpu", devices=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[JobsightCallback(profile={"wait": 2, "warmup": 1, "active": 3, "repeat": 1})],
        default_root_dir=os.getcwd(), log_every_n_steps=5,
    )
    trainer.fit(Tiny(), DataLoader(data, batch_size=16))
    print("E2E_DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
