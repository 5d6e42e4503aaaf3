"""The demo job of ``jobsight up --demo``: a small real CPU training run with the Lightning
callback, the log handler and a profiling window, so the first page shows a live job.

The job is labelled as a demo (``jobs.demo``) and named "demo: …". It runs for
``JOBSIGHT_DEMO_MINUTES`` (default 10) and then reports itself ended; SIGTERM or
Ctrl-C ends it early, the same way. Without torch and Lightning installed it says so
and exits 0 (``jobsight up`` must not fail for want of the frameworks extra).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import socket
import sys
import time
from types import FrameType
from typing import Any

from jobsight.protocol import wire

log = logging.getLogger("demo")


def _minutes() -> float:
    try:
        return max(float(os.environ.get("JOBSIGHT_DEMO_MINUTES", "10")), 0.05)
    except ValueError:
        return 10.0


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s demo %(levelname)s %(message)s")
    os.environ.setdefault("JOBSIGHT_JOB_ID", f"demo-{socket.gethostname()}-{int(time.time())}")
    try:
        import lightning.pytorch as pl
        import torch
    except ImportError as exc:
        log.warning("no demo job: %s (install jobsight[frameworks])", exc)
        return 0
    from jobsight.agent.shipping.shipper import get_shipper
    from jobsight.agent.training.lightning import JobsightCallback

    torch.set_num_threads(1)

    class DemoModel(pl.LightningModule):
        """A small MLP learning a noisy sine; slow enough to watch."""

        def __init__(self, hidden: int = 64, lr: float = 0.01) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.lr = lr
            self.net = torch.nn.Sequential(
                torch.nn.Linear(8, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
                torch.nn.Linear(hidden, 1),
            )

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            if batch_idx % 50 == 0:
                log.info("epoch %d batch %d loss %.4f", self.current_epoch, batch_idx, float(loss))
            time.sleep(0.02)  # a GPU-sized step on a laptop: the charts move at a readable pace
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=self.lr)

    x = torch.rand(4096, 8) * 6 - 3
    y = torch.sin(x).sum(dim=1, keepdim=True) + 0.05 * torch.randn(4096, 1)
    data = torch.utils.data.TensorDataset(x, y)
    train = torch.utils.data.DataLoader(torch.utils.data.Subset(data, range(3584)), batch_size=32, shuffle=True)
    val = torch.utils.data.DataLoader(torch.utils.data.Subset(data, range(3584, 4096)), batch_size=128)
    callback = JobsightCallback(
        profile={"skip_first": 20, "wait": 1, "warmup": 2, "active": 5}, demo=True, run_name="demo: tiny MLP on CPU"
    )
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_time=dt.timedelta(minutes=_minutes()), max_epochs=-1, callbacks=[callback],
        logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        log_every_n_steps=10,
    )
    stopped: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        stopped.append(signum)
        trainer.should_stop = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    exit_code = 0
    try:
        trainer.fit(DemoModel(), train, val)
    except Exception:  # boundary: the demo reports its failure as the job's end, then exits non-zero
        log.exception("demo training failed")
        exit_code = 1
    shipper = get_shipper()
    shipper.enqueue({
        "kind": "job_ended", "job": os.environ["JOBSIGHT_JOB_ID"], "ts": wire.now_us(), "node": shipper.settings.node,
        "exit_code": exit_code, "state": "cancelled" if stopped else None,
    })
    shipper.flush(5.0)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
