"""Two-process DDP on gloo: both ranks report, and the profile breakdown sees the all-reduce."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from jobsight.collector.embedded_db import free_port  # noqa: E402
from tests.frameworks.support import api, rows, wait_for  # noqa: E402

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


def test_two_ranks_report_and_see_communication(live_collector: Any, db: Any, job_id: str, tmp_path: Path) -> None:
    script = tmp_path / "ddp_worker.py"
    script.write_text(WORKER)
    env = {
        **os.environ, "JOBSIGHT_URL": live_collector.url, "JOBSIGHT_TOKEN": live_collector.token,
        "JOBSIGHT_JOB_ID": job_id, "JOBSIGHT_SPOOL_DIR": str(tmp_path / "spool"), "JOBSIGHT_BATCH_AGE_S": "0.1",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "PYTHONPATH": str(REPO),
    }
    subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=120, cwd=REPO)
    ranks = rows(db, "SELECT rank, count(*) FROM steps WHERE job_id = %s GROUP BY rank ORDER BY rank", job_id)
    assert ranks == [(0, 6), (1, 6)]
    profiles = wait_for(lambda: (p := api(live_collector, f"/v1/jobs/{job_id}/profiles")["profiles"]) and len(p) == 2
                        and p)
    assert sorted(p["rank"] for p in profiles) == [0, 1]
    for profile in profiles:
        times = profile["summary"]["breakdown"]
        assert times["communication_us"] > 0, times
        assert times["comm_overlap"] is not None
    diagnosis = api(live_collector, f"/v1/jobs/{job_id}/diagnosis")
    assert diagnosis["steps_considered"] == 12
