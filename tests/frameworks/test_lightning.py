"""A tiny Lightning model trains with the callback against a real collector."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from jobsight.agent.training.lightning import JobsightCallback  # noqa: E402
from tests.frameworks.support import agent_settings, api, rows, wait_for  # noqa: E402

log = logging.getLogger("tests.tiny_model")


class TinyModel(pl.LightningModule):  # type: ignore[misc]
    def __init__(self, lr: float = 0.05, fail_at: int | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(16, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.hparams.fail_at is not None and self.global_step == self.hparams.fail_at:
            raise ValueError("boom at the chosen step")
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        if batch_idx == 0:
            log.info("first batch of epoch %d", self.current_epoch)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def loaders() -> tuple[Any, Any]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16, generator=generator)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    train = torch.utils.data.DataLoader(data, batch_size=8)
    val = torch.utils.data.DataLoader(torch.utils.data.Subset(data, range(16)), batch_size=8)
    return train, val


def trainer(callback: JobsightCallback, tmp_path: Path, epochs: int = 2) -> Any:
    return pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=epochs, callbacks=[callback], logger=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
        log_every_n_steps=2, num_sanity_val_steps=0,
    )


def test_fit_records_steps_metrics_logs_and_a_profile(
    live_collector: Any, db: Any, job_id: str, tmp_path: Path
) -> None:
    callback = JobsightCallback(
        profile={"wait": 1, "warmup": 1, "active": 3}, settings=agent_settings(live_collector, job_id, tmp_path)
    )
    train, val = loaders()
    trainer(callback, tmp_path).fit(TinyModel(), train, val)

    steps = wait_for(lambda: rows(db, "SELECT step, rank, pid, data_wait_s, compute_s, samples FROM steps "
                                      "WHERE job_id = %s ORDER BY step", job_id) if len(
        rows(db, "SELECT 1 FROM steps WHERE job_id = %s", job_id)) >= 16 else None)
    assert [s[0] for s in steps] == list(range(16))
    assert all(s[2] > 0 and s[3] is not None and s[4] > 0 and s[5] == 8 for s in steps)

    names = {r[0] for r in rows(db, "SELECT DISTINCT name FROM metrics WHERE job_id = %s", job_id)}
    assert {"train_loss", "val_loss"} <= names
    # Every record is tagged with its thread: steps and metrics too, not only log lines.
    untagged = rows(db, "SELECT count(*) FROM steps WHERE job_id = %s AND (tid IS NULL OR pid IS NULL)"
                        " UNION ALL SELECT count(*) FROM metrics WHERE job_id = %s AND tid IS NULL", job_id, job_id)
    assert untagged == [(0,), (0,)]

    logs = rows(db, "SELECT logger, message, pid, tid, attrs FROM log_events WHERE job_id = %s", job_id)
    messages = [r[1] for r in logs]
    assert "first batch of epoch 0" in messages and "first batch of epoch 1" in messages
    assert any(m.startswith("fit started on rank 0") for m in messages)
    assert any(m == "epoch 1 ended" for m in messages)
    assert any(m.startswith("validation after epoch 0") for m in messages)
    assert all(r[2] and r[3] for r in logs)

    job = api(live_collector, f"/v1/jobs/{job_id}")
    assert job["attrs"]["run"]["hparams"]["lr"] == 0.05
    assert job["attrs"]["run"]["world_size"] == 1

    profiles = api(live_collector, f"/v1/jobs/{job_id}/profiles")["profiles"]
    assert len(profiles) == 1
    profile = profiles[0]
    assert (profile["step_start"], profile["step_end"]) == (2, 4)
    summary = profile["summary"]
    assert summary["steps"] == 3 and summary["framework"] == "lightning"
    ops = {op["name"] for op in summary["ops_by_self_cpu"]}
    assert "aten::addmm" in ops or "aten::linear" in ops
    assert summary["breakdown"]["compute_us"] > 0 and summary["breakdown"]["basis"] == "host"
    assert isinstance(profile["diagnosis"], list)

    trace, headers = api(live_collector, profile["trace_url"])
    assert "traceEvents" in json.loads(trace)
    assert headers["Content-Disposition"].endswith('.pt.trace.json.gz"')
    plain = api(live_collector, profile["trace_url"] + "?format=json")
    assert plain["traceEvents"]


def test_profiling_off_makes_no_profiler_and_exceptions_are_recorded(
    live_collector: Any, db: Any, job_id: str, tmp_path: Path
) -> None:
    callback = JobsightCallback(on_demand=False, settings=agent_settings(live_collector, job_id, tmp_path))
    train, val = loaders()
    with pytest.raises(ValueError, match="boom"):
        trainer(callback, tmp_path).fit(TinyModel(fail_at=3), train, val)
    errors = wait_for(lambda: rows(db, "SELECT message, exception, level FROM log_events "
                                       "WHERE job_id = %s AND level = 'ERROR'", job_id))
    assert "boom at the chosen step" in errors[0][0]
    assert "Traceback" in errors[0][1] and "training_step" in errors[0][1]
    assert rows(db, "SELECT count(*) FROM profiles WHERE job_id = %s", job_id)[0][0] == 0


def test_bad_configuration_fails_in_init() -> None:
    with pytest.raises(ValueError, match="active"):
        JobsightCallback(profile={"active": 0})
    with pytest.raises(ValueError, match="ranks"):
        JobsightCallback(profile=True, profile_ranks=[-1])
    with pytest.raises(TypeError):
        JobsightCallback(profile="yes")  # type: ignore[arg-type]


def test_a_users_own_profiler_is_left_alone(live_collector: Any, job_id: str, tmp_path: Path) -> None:
    """Our window cannot start under the user's profiler: a warning, training goes on, theirs keeps running."""
    settings = agent_settings(live_collector, job_id, tmp_path)
    callback = JobsightCallback(profile=True, on_demand=False, settings=settings)
    train, val = loaders()
    with torch.profiler.profile() as theirs, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(callback, tmp_path, epochs=1).fit(TinyModel(), train, val)
        torch.ones(2).add(1)
    assert any("profiling is off" in str(w.message) for w in caught)
    assert any(e.key == "aten::add" for e in theirs.key_averages())


def test_demo_job_trains_profiles_and_is_labelled(live_collector: Any, job_id: str, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "JOBSIGHT_URL": live_collector.url, "JOBSIGHT_TOKEN": live_collector.token,
           "JOBSIGHT_JOB_ID": job_id, "JOBSIGHT_DEMO_MINUTES": "0.12", "JOBSIGHT_SPOOL_DIR": str(tmp_path / "spool")}
    subprocess.run([sys.executable, "-m", "jobsight.agent.training.demo"], env=env, check=True, timeout=120,
                   cwd=Path(__file__).resolve().parents[2], capture_output=True)
    job = api(live_collector, f"/v1/jobs/{job_id}")
    assert job["demo"] is True and job["name"].startswith("demo:") and job["state"] == "completed"
    assert api(live_collector, f"/v1/jobs/{job_id}/profiles")["profiles"]
    assert api(live_collector, f"/v1/jobs/{job_id}/logs")["logs"]
