"""A real two-process DDP run on gloo (CPU) with a profile window on every rank, shipped to a
live collector: shared by the tests that look at what such a run reports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from jobsight.collector.store.embedded_db import free_port

REPO = Path(__file__).resolve().parents[2]

WORKER = r'''
import os, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp

def work(rank: int) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    import jobsight.agent.training.torch as jtorch
    torch.manual_seed(rank)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                                                         torch.nn.Linear(256, 256)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [torch.randn(32, 256) for _ in range(6)]
    with jtorch.profiler(enabled=True, ranks=None, wait=1, warmup=1, active=3) as prof:
        for x in jtorch.steps(batches):
            model(x).pow(2).mean().backward()
            opt.step(); opt.zero_grad()
            prof.step()
    jtorch.finish(10)
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(work, nprocs=2)
'''


def run_two_rank_ddp(live: Any, job_id: str, tmp_path: Path) -> None:
    """Run :data:`WORKER` (2 ranks × 6 steps, steps 2–4 profiled on both) against ``live``."""
    script = tmp_path / "ddp_worker.py"
    script.write_text(WORKER)
    env = {
        **os.environ, "JOBSIGHT_URL": live.url, "JOBSIGHT_TOKEN": live.token,
        "JOBSIGHT_JOB_ID": job_id, "JOBSIGHT_SPOOL_DIR": str(tmp_path / "spool"), "JOBSIGHT_BATCH_AGE_S": "0.1",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "PYTHONPATH": str(REPO),
    }
    subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=120, cwd=REPO)
