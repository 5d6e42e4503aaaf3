"""On-demand profiling end to end: request → directive poll → window → upload → done."""

from __future__ import annotations

import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import jobsight.agent.training.torch as jtorch  # noqa: E402
from jobsight.protocol import wire  # noqa: E402
from tests.frameworks.support import agent_settings, api, wait_for  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_run() -> Iterator[None]:
    jtorch.finish(0.5)
    yield
    jtorch.finish(0.5)


def requests_of(live: Any, job_id: str) -> list[dict[str, Any]]:
    return list(api(live, f"/v1/jobs/{job_id}/profile-requests")["requests"])


def test_request_is_fulfilled_and_reads_done(live_collector: Any, job_id: str, tmp_path: Path) -> None:
    run = jtorch.init(agent_settings(live_collector, job_id, tmp_path))
    model = torch.nn.Linear(8, 2)
    with jtorch.profiler(enabled=False) as prof:
        # A few steps first, so the collector knows the job.
        for x in jtorch.steps([torch.randn(4, 8) for _ in range(3)]):
            model(x).sum().backward()
            prof.step()
        run.recorder.flush(5)
        created = api(live_collector, f"/v1/jobs/{job_id}/profile-requests", "POST", {"steps": 2, "ranks": [0]})
        assert created["state"] == "pending"
        deadline = time.monotonic() + 20
        while requests_of(live_collector, job_id)[0]["state"] in ("pending", "running"):
            assert time.monotonic() < deadline, requests_of(live_collector, job_id)
            model(torch.randn(4, 8)).sum().backward()
            prof.step()
            run.recorder.flush(0.05)
            time.sleep(0.05)
    request = requests_of(live_collector, job_id)[0]
    assert request["state"] == "done" and request["profile_id"]
    profile = api(live_collector, f"/v1/jobs/{job_id}/profiles")["profiles"][0]
    assert profile["request_id"] == created["id"] and profile["profile_id"] == request["profile_id"]
    assert profile["summary"]["steps"] == 2
    assert run.poller is not None and run.poller.polls >= 1


def test_request_fails_with_a_reason_when_the_job_ends(live_collector: Any, job_id: str, tmp_path: Path) -> None:
    run = jtorch.init(agent_settings(live_collector, job_id, tmp_path), on_demand=False)
    jtorch.record_step(0, 0.01)
    run.recorder.flush(5)
    api(live_collector, f"/v1/jobs/{job_id}/profile-requests", "POST", {"steps": 3})
    run.recorder.shipper.enqueue({"kind": "job_ended", "job": job_id, "ts": wire.now_us(), "exit_code": 0})
    run.recorder.flush(5)
    request = requests_of(live_collector, job_id)[0]
    assert request["state"] == "failed" and "ended" in request["reason"]
    # A finished request does not move again.
    with pytest.raises(urllib.error.HTTPError) as excinfo:
        api(live_collector, f"/v1/profile-requests/{request['id']}/state", "POST", {"state": "running"})
    assert excinfo.value.code == 409


def test_request_for_an_unknown_job_is_404(live_collector: Any, job_id: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as excinfo:
        api(live_collector, f"/v1/jobs/{job_id}/profile-requests", "POST", {"steps": 3})
    assert excinfo.value.code == 404
    assert wait_for(lambda: True)
