"""What a single-process CPU Lightning run (the shape of ``jobsight up --demo``) looks like to its
reader outside Slurm: its log lines carry rank 0, its profile does not call CPU time idle, and the
job says whose run it is and that no partition applies."""

from __future__ import annotations

import os
import pwd
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from jobsight.agent.training.lightning import JobsightCallback  # noqa: E402
from jobsight.dashboard import job_facts  # noqa: E402
from jobsight.protocol.wire import encode_batch, now_us  # noqa: E402
from tests.frameworks.support import agent_settings, api, rows, wait_for  # noqa: E402
from tests.frameworks.test_lightning import TinyModel, loaders, trainer  # noqa: E402


class SleepyModel(TinyModel):
    """The demo's step: a little compute and a sleep, as a GPU-sized step on a laptop."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        time.sleep(0.02)
        return super().training_step(batch, batch_idx)


def _post_log(live: Any, job_id: str, pid: int) -> None:
    """A line from another process of the job that no record ties to a rank."""
    body = encode_batch(f"other-{pid}", 1, [{
        "kind": "log", "job": job_id, "ts": now_us(), "node": "testnode", "pid": pid, "level": "INFO",
        "logger": "launcher", "message": "a line from the launcher"}])
    request = urllib.request.Request(live.url + "/v1/ingest", data=body, method="POST", headers={
        "Authorization": f"Bearer {live.token}", "Content-Encoding": "gzip", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


@pytest.fixture
def cpu_run(live_collector: Any, job_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)  # a laptop run, even when the tests run under Slurm
    for name in ("RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)  # the log handler finds no rank, as in the demo
    callback = JobsightCallback(profile={"wait": 1, "warmup": 1, "active": 3},
                                settings=agent_settings(live_collector, job_id, tmp_path))
    train, val = loaders()
    trainer(callback, tmp_path).fit(SleepyModel(), train, val)
    wait_for(lambda: api(live_collector, f"/v1/jobs/{job_id}/profiles")["profiles"])
    return job_id


def test_log_lines_without_a_rank_take_their_process_s_rank(live_collector: Any, db: Any, cpu_run: str) -> None:
    job_id = cpu_run
    other_pid = os.getpid() + 100_000
    _post_log(live_collector, job_id, other_pid)
    # As sent: the handler's lines have no rank (no RANK in the environment) ...
    stored = rows(db, "SELECT rank, pid FROM log_events WHERE job_id = %s AND message = %s", job_id,
                  "first batch of epoch 0")
    assert stored == [(None, os.getpid())]
    # ... and as read, the rank the same process's steps and run events carry.
    lines = api(live_collector, f"/v1/jobs/{job_id}/logs?limit=1000")["logs"]
    by_message = {line["message"]: line for line in lines}
    first = by_message["first batch of epoch 0"]
    assert (first["rank"], first["rank_from_pid"]) == (0, True)
    assert by_message["epoch 0 ended"]["rank"] == 0 and by_message["epoch 0 ended"]["rank_from_pid"] is False
    launcher = by_message["a line from the launcher"]
    assert (launcher["rank"], launcher["rank_from_pid"]) == (None, False)  # no record ties its pid to a rank
    ranked = {line["message"] for line in api(live_collector, f"/v1/jobs/{job_id}/logs?rank=0&limit=1000")["logs"]}
    assert "first batch of epoch 1" in ranked and "a line from the launcher" not in ranked


def test_a_cpu_profile_does_not_call_host_time_idle(live_collector: Any, cpu_run: str) -> None:
    (profile,) = api(live_collector, f"/v1/jobs/{cpu_run}/profiles")["profiles"]
    times = profile["summary"]["breakdown"]
    assert times["basis"] == "host"
    assert "idle_us" not in times and "idle_share" not in times
    # Most of each step is the sleep, outside any op: other host time, not idle.
    assert times["host_other_share"] > 0.5, times
    parts = ("compute", "communication", "memcpy", "data_loading", "host_other")
    assert sum(times[f"{part}_us"] for part in parts) == pytest.approx(times["window_us"], abs=1.0)
    assert not any(hint["rule"] in ("idle_gpu", "launch_bound") for hint in profile["diagnosis"])


def test_outside_slurm_the_job_names_the_process_s_user_and_no_partition(live_collector: Any,
                                                                         cpu_run: str) -> None:
    job = api(live_collector, f"/v1/jobs/{cpu_run}")
    me = pwd.getpwuid(os.getuid()).pw_name
    assert job["attrs"]["process"] == {"user": me, "uid": os.getuid(), "slurm": False}
    assert job["user_name"] is None  # Slurm's accounting field stays the prolog's
    assert (job_facts.user(job), job_facts.partition(job)) == (me, job_facts.NOT_APPLICABLE)
