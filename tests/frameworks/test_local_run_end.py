"""Runs outside Slurm end when their processes end, and are never called hung.

Each script runs as a newcomer would run it (README, "In a training script"): no Slurm variables, no job
id, the collector on loopback with its admin token found in its data directory; a real collector
process on a database of its own (reconciliation reads every running job), with its own passes off so
the test drives them with ``now=`` moved (no sleeping): the reconciliation pass
(collector/passes/reconcile.py, local_runs.py) and the health evaluator (collector/passes/findings.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

pytest.importorskip("torch")

from jobsight.collector.config.health import load_health_settings  # noqa: E402
from jobsight.collector.config.reconcile import load_reconcile_settings  # noqa: E402
from jobsight.collector.passes.findings import HealthEvaluator  # noqa: E402
from jobsight.collector.passes.reconcile import JobReconciler  # noqa: E402
from jobsight.collector.store import migrate  # noqa: E402
from jobsight.collector.store.embedded_db import EmbeddedPostgres  # noqa: E402
from tests.conftest import LiveCollector, create_database  # noqa: E402
from tests.frameworks.support import wait_for  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
NO_SLURM = {"sacct": "/nonexistent/sacct", "squeue": "/nonexistent/squeue"}
PASSES_OFF = {"JOBSIGHT_RECONCILE_INTERVAL_S": "0", "JOBSIGHT_HEALTH_INTERVAL_S": "0"}
LAUNCHER_VARS = ("JOBSIGHT_JOB_ID", "JOBSIGHT_TOKEN", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT",
                 "MASTER_ADDR", "TORCHELASTIC_RUN_ID")

TORCH_MODEL = """
import torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4)), batch_size=8)
def train(x):
    loss = model(x).pow(2).mean(); loss.backward(); opt.step(); opt.zero_grad()
"""
SCRIPTS = {
    # The README's two lines: the profiler's with block ends the run.
    "pytorch": TORCH_MODEL + """
from jobsight.agent.training.torch import profiler, steps
with profiler(enabled=False) as prof:
    for (x,) in steps(loader):
        train(x); prof.step()
""",
    # The real profiler's with block ends it too.
    "pytorch-profiled": TORCH_MODEL + """
from jobsight.agent.training.torch import profiler, steps
with profiler(enabled=True, wait=0, warmup=1, active=1, on_demand=False) as prof:
    for (x,) in steps(loader):
        train(x); prof.step()
""",
    # steps() alone, no profiler and no finish(): the interpreter's exit ends the run.
    "pytorch-steps-only": TORCH_MODEL + """
from jobsight.agent.training.torch import steps
for (x,) in steps(loader):
    train(x)
""",
    "lightning": """
import torch, lightning.pytorch as pl
from jobsight.agent.training.lightning import JobsightCallback
class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__(); self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(24, 4)), batch_size=8)
trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     callbacks=[JobsightCallback(on_demand=False)])
trainer.fit(Tiny(), data)
""",
    "keras": """
import numpy as np, keras
from jobsight.agent.training.keras import JobsightCallback
x = np.random.default_rng(0).normal(size=(24, 4)).astype("float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(x, x.sum(axis=1, keepdims=True), batch_size=8, epochs=1, verbose=0,
          callbacks=[JobsightCallback(on_demand=False)])
""",
    # torchrun's two ranks (no collective needed): rank 1 opens its run, then waits for the test's word.
    "torchrun": TORCH_MODEL + """
import os, pathlib, time
from jobsight.agent.training.torch import profiler, steps
with profiler(enabled=False) as prof:
    if os.environ["RANK"] == "1":
        go = pathlib.Path(os.environ["GO_FILE"])
        while not go.exists():
            time.sleep(0.05)
    for (x,) in steps(loader):
        train(x); prof.step()
""",
    # An uncaught exception: the run ends by it, and the traceback is still printed.
    "pytorch-raises": TORCH_MODEL + """
from jobsight.agent.training.torch import steps
for (x,) in steps(loader):
    train(x)
raise RuntimeError("the loss went NaN")
""",
    # A forked child exits through atexit: it ends no run of its parent's.
    "pytorch-forks": TORCH_MODEL + """
import os, sys
from jobsight.agent.training.torch import steps
for (x,) in steps(loader):
    train(x)
child = os.fork()
if child == 0:
    sys.exit(0)
os.waitpid(child, 0)
for (x,) in steps(loader):
    train(x)
""",
    # Steps until killed: a SIGKILL says nothing.
    "pytorch-killed": TORCH_MODEL + """
import itertools, time
from jobsight.agent.training.torch import profiler, steps
with profiler(enabled=False) as prof:
    for (x,) in steps(itertools.cycle(loader)):
        train(x); prof.step(); time.sleep(0.05)
""",
}


@pytest.fixture
def collector(postgres: EmbeddedPostgres, data_dir: Path, admin_token: str, tmp_path: Path) -> Iterator[LiveCollector]:
    url = create_database(postgres, f"lr_{uuid.uuid4().hex[:12]}")
    migrate.upgrade(url)
    live = LiveCollector(url, data_dir, admin_token, tmp_path / "collector.log", env=PASSES_OFF)
    live.start()
    yield live
    live.kill()


@pytest.fixture
def conn(collector: LiveCollector) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    with psycopg.connect(collector.database_url, autocommit=True, row_factory=dict_row) as c:
        yield c


def outside_slurm(live: LiveCollector, tmp_path: Path, node: str) -> dict[str, str]:
    """The environment of a script a user starts on a workstation: nothing of Slurm or a launcher."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in LAUNCHER_VARS}
    env.update(JOBSIGHT_URL=live.url, JOBSIGHT_DATA_DIR=str(live.data_dir), JOBSIGHT_NODE=node,
               JOBSIGHT_SPOOL_DIR=str(tmp_path / f"spool-{node}"), JOBSIGHT_BATCH_AGE_S="0.1",
               KERAS_BACKEND="torch", PYTHONPATH=str(REPO))
    return env


def start(live: LiveCollector, tmp_path: Path, name: str, *launcher: str,
          **env: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start script ``name`` (under ``launcher``'s module, e.g. torchrun's); returns the process and its
    node name (the local job id's middle)."""
    node = f"ws{uuid.uuid4().hex[:8]}"
    script = tmp_path / f"run_{name.replace('-', '_')}.py"  # not lightning.py: it would shadow lightning
    script.write_text(SCRIPTS[name])
    process = subprocess.Popen([sys.executable, *launcher, str(script)], cwd=tmp_path,
                               env={**outside_slurm(live, tmp_path, node), **env},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return process, node


def events(conn: psycopg.Connection[dict[str, Any]], job: str, *names: str) -> list[tuple[int | None, str]]:
    """(rank, event) of the job's run events named ``names``, in time order."""
    rows = conn.execute("SELECT rank, attrs->>'event' AS event FROM log_events WHERE job_id = %s "
                        "AND attrs->>'event' = ANY(%s) ORDER BY ts", (job, list(names))).fetchall()
    return [(r["rank"], r["event"]) for r in rows]


def the_job(conn: psycopg.Connection[dict[str, Any]], node: str) -> dict[str, Any] | None:
    """The run's job: its id is local-<node>-<pid>-<start> (one job, whatever the number of processes)."""
    rows = conn.execute("SELECT * FROM jobs WHERE job_id LIKE %s", (f"local-{node}-%",)).fetchall()
    assert len(rows) <= 1, rows
    return rows[0] if rows else None


def hung_findings(conn: psycopg.Connection[dict[str, Any]], job: str, now: float) -> list[dict[str, Any]]:
    HealthEvaluator(load_health_settings()).evaluate_once(conn, now=now)
    return conn.execute("SELECT rule, subject, title FROM findings WHERE job_id = %s AND rule = 'hung_rank'",
                        (job,)).fetchall()


def reconcile(conn: psycopg.Connection[dict[str, Any]], now: float) -> dict[str, Any]:
    JobReconciler(load_reconcile_settings(**NO_SLURM)).reconcile_once(conn, now=now)
    return conn.execute("SELECT * FROM jobs WHERE job_id LIKE 'local-%'").fetchone() or {}


@pytest.mark.parametrize("name", ["pytorch", "pytorch-profiled", "pytorch-steps-only", "lightning", "keras"])
def test_a_run_outside_slurm_ends_completed_when_its_script_ends_and_is_never_hung(
    collector: LiveCollector, conn: psycopg.Connection[dict[str, Any]], tmp_path: Path, name: str,
) -> None:
    """The script ends normally: its one process said its run ended (the profiler's with block, the
    callback's end hook, the interpreter's exit), so four minutes on the hung rule names no rank, and
    the reconciliation pass ends the job ``completed`` at that end, long before any silence counts."""
    process, node = start(collector, tmp_path, name)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output.decode()[-3000:]
    job = wait_for(lambda: the_job(conn, node))
    assert job["state"] == "running" and job["user_name"] is None
    ends = events(conn, job["job_id"], "run_end", "fit_end", "exception")
    assert ends == [(0 if name == "lightning" else None, "fit_end" if name in ("lightning", "keras") else "run_end")]

    now = time.time()
    # Before the job ends: its rank stopped stepping, but it said it is done.
    assert hung_findings(conn, job["job_id"], now + 240) == []
    ended = reconcile(conn, now + 60)
    assert (ended["state"], ended["exit_code"]) == ("completed", None), ended
    assert ended["attrs"]["end_source"] == "processes"
    assert ended["attrs"]["end_reason"] == "1 process of the run said they ended"
    assert ended["end_time"] <= ended["last_seen"]
    assert conn.execute("SELECT 1 FROM job_summaries WHERE job_id = %s", (job["job_id"],)).fetchone()
    assert hung_findings(conn, job["job_id"], now + 300) == []


def test_an_uncaught_exception_ends_the_run_failed_and_the_traceback_is_still_printed(
    collector: LiveCollector, conn: psycopg.Connection[dict[str, Any]], tmp_path: Path,
) -> None:
    process, node = start(collector, tmp_path, "pytorch-raises")
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 1 and "RuntimeError: the loss went NaN" in output.decode()
    job = wait_for(lambda: the_job(conn, node))
    assert events(conn, job["job_id"], "run_start", "run_end", "exception") == [(None, "run_start"),
                                                                                 (None, "exception")]
    logged = conn.execute("SELECT exception FROM log_events WHERE job_id = %s AND attrs->>'event' = 'exception'",
                          (job["job_id"],)).fetchone()
    assert "RuntimeError: the loss went NaN" in logged["exception"]
    ended = reconcile(conn, time.time() + 60)
    assert (ended["state"], ended["attrs"]["end_reason"]) == (
        "failed", "1 process of the run said they ended (1 by an exception)")


def test_a_forked_child_that_exits_ends_no_run_of_its_parent(
    collector: LiveCollector, conn: psycopg.Connection[dict[str, Any]], tmp_path: Path,
) -> None:
    """The child's records would carry the parent's pid: its exit must not say the parent's run ended."""
    process, node = start(collector, tmp_path, "pytorch-forks")
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output.decode()[-3000:]
    job = wait_for(lambda: the_job(conn, node))
    assert events(conn, job["job_id"], "run_start", "run_end", "exception") == [(None, "run_start"),
                                                                                 (None, "run_end")]
    assert conn.execute("SELECT count(*) AS n FROM steps WHERE job_id = %s", (job["job_id"],)).fetchone()["n"] == 8


def test_a_run_killed_without_a_word_ends_silent_after_the_set_time_and_is_never_hung(
    collector: LiveCollector, conn: psycopg.Connection[dict[str, Any]], tmp_path: Path,
) -> None:
    """SIGKILL: no end event. The job stays running until it has been silent ``silent_after_s``
    (600 s by default), then ends ``silent`` at its last record, with its summary; no hung finding."""
    process, node = start(collector, tmp_path, "pytorch-killed")
    try:
        job = wait_for(lambda: the_job(conn, node), timeout=120)
        wait_for(lambda: conn.execute("SELECT count(*) AS n FROM steps WHERE job_id = %s",
                                      (job["job_id"],)).fetchone()["n"] >= 3, timeout=120)
    finally:
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL

    now = time.time()
    still = reconcile(conn, now + 60)
    assert still["state"] == "running", "ended before it was silent for silent_after_s"
    ended = reconcile(conn, now + 600 + 60)
    assert (ended["state"], ended["exit_code"]) == ("silent", None), ended
    assert ended["end_time"] == ended["last_seen"]
    assert ended["attrs"]["end_source"] == "reconcile"
    assert "a run outside Slurm whose processes stopped without a word (0 of 1 process said they ended)" in \
        ended["attrs"]["end_reason"]
    assert conn.execute("SELECT 1 FROM job_summaries WHERE job_id = %s", (job["job_id"],)).fetchone()
    assert hung_findings(conn, job["job_id"], now + 600 + 240) == []


def test_torchrun_ranks_share_one_job_that_ends_when_the_last_of_them_ends(
    collector: LiveCollector, conn: psycopg.Connection[dict[str, Any]], tmp_path: Path,
) -> None:
    """Two ranks under torchrun share their launcher's local id. Rank 0 ends first: the job still runs
    while rank 1 has opened its run and not ended it; once rank 1 ends too, the job ends ``completed``.
    Both named ranks stopped stepping minutes before the evaluator's clock, and neither is called hung:
    each said it is done."""
    go = tmp_path / "go"
    process, node = start(collector, tmp_path, "torchrun", "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node=2", GO_FILE=str(go))
    try:
        job = wait_for(lambda: the_job(conn, node), timeout=120)
        wait_for(lambda: {(0, "run_end"), (1, "run_start")} <= set(events(conn, job["job_id"], "run_start",
                                                                                  "run_end")), timeout=120)
        assert reconcile(conn, time.time() + 60)["state"] == "running", "ended while rank 1 runs"
    finally:
        go.touch()
        output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output.decode()[-3000:]
    assert sorted(events(conn, job["job_id"], "run_start", "run_end")) == [
        (0, "run_end"), (0, "run_start"), (1, "run_end"), (1, "run_start")]

    now = time.time()
    assert hung_findings(conn, job["job_id"], now + 240) == []
    ended = reconcile(conn, now + 60)
    assert (ended["state"], ended["attrs"]["end_reason"]) == ("completed", "2 processes of the run said they all ended")
    assert {r["rank"] for r in conn.execute("SELECT DISTINCT rank FROM steps WHERE job_id = %s",
                                            (job["job_id"],))} == {0, 1}
