"""Keras 3 (torch backend): batch and epoch records, and profile_epoch=2 profiles epoch 2 alone."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "torch":
    pytest.skip("these tests need KERAS_BACKEND=torch", allow_module_level=True)
np = pytest.importorskip("numpy")

from jobsight.agent.training.keras import JobsightCallback  # noqa: E402
from tests.frameworks.support import agent_settings, api, rows, wait_for  # noqa: E402

EPOCHS, BATCHES = 4, 4


def fit(callback: JobsightCallback) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16 * BATCHES, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, y, batch_size=16, epochs=EPOCHS, validation_split=0.25, verbose=0, callbacks=[callback])


def test_profile_epoch_two_profiles_epoch_two_only(live_collector: Any, db: Any, job_id: str, tmp_path: Path) -> None:
    settings = agent_settings(live_collector, job_id, tmp_path)
    callback = JobsightCallback(profile_epoch=2, on_demand=False, settings=settings)
    fit(callback)
    assert callback.profiled_epochs == [2]
    per_epoch = BATCHES * 3 // 4  # validation_split keeps a quarter back
    steps = rows(db, "SELECT step, epoch FROM steps WHERE job_id = %s ORDER BY step", job_id)
    assert [s[1] for s in steps] == [e for e in range(EPOCHS) for _ in range(per_epoch)]
    profiles = wait_for(lambda: api(live_collector, f"/v1/jobs/{job_id}/profiles")["profiles"])
    assert len(profiles) == 1
    profile = profiles[0]
    assert profile["summary"]["epoch"] == 2 and profile["summary"]["backend"] == "torch"
    assert (profile["step_start"], profile["step_end"]) == (2 * per_epoch, 3 * per_epoch - 1)
    assert profile["summary"]["ops_by_self_cpu"] and profile["trace_url"]
    names = {r[0] for r in rows(db, "SELECT DISTINCT name FROM metrics WHERE job_id = %s", job_id)}
    assert {"loss", "val_loss"} <= names
    events = [r[0] for r in rows(db, "SELECT message FROM log_events WHERE job_id = %s", job_id)]
    assert "epoch 3 ended" in events and "fit started" in events


def test_bad_profile_epoch_fails_in_init() -> None:
    with pytest.raises(ValueError, match="profile_epoch"):
        JobsightCallback(profile_epoch=-1)
    with pytest.raises(ValueError, match="profile_epoch"):
        JobsightCallback(profile_epoch="2")  # type: ignore[arg-type]
