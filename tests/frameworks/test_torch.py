"""Plain PyTorch: profiler() real or null, the steps() helper, and importing without torch."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import jobsight.agent.training.torch as jtorch  # noqa: E402
from tests.frameworks.support import agent_settings, api, rows, wait_for  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_run() -> Iterator[None]:
    jtorch.finish(0.5)
    yield
    jtorch.finish(0.5)


def test_agent_imports_without_importing_torch() -> None:
    code = ("import sys, jobsight.agent.training.torch, jobsight.agent.training.profiling, "
            "jobsight.protocol.diagnosis, jobsight.agent.training.directives, jobsight.agent.training.run_records; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_disabled_profiler_is_a_null_object(live_collector: Any, job_id: str, tmp_path: Path) -> None:
    jtorch.init(agent_settings(live_collector, job_id, tmp_path), on_demand=False)
    prof = jtorch.profiler(enabled=False)
    assert isinstance(prof, jtorch.NullProfiler)
    with prof as entered:
        entered.step()
    assert not torch._C._autograd._profiler_enabled()
    # Not a chosen rank: null as well.
    assert isinstance(jtorch.profiler(enabled=True, ranks=[5]), jtorch.NullProfiler)
    with pytest.raises(ValueError):
        jtorch.profiler(enabled=True, active=0)


def test_enabled_profiler_is_real_and_uploads(live_collector: Any, db: Any, job_id: str, tmp_path: Path) -> None:
    jtorch.init(agent_settings(live_collector, job_id, tmp_path), on_demand=False)
    model = torch.nn.Linear(8, 2)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(48, 8)), batch_size=8)
    with jtorch.profiler(enabled=True, wait=1, warmup=1, active=2) as prof:
        assert isinstance(prof, torch.profiler.profile)
        for (x,) in jtorch.steps(loader, epoch=0):
            model(x).sum().backward()
            jtorch.record_metrics({"loss": torch.tensor(1.5), "bad": float("nan")}, step=0)
            prof.step()
    jtorch.finish()
    steps = rows(db, "SELECT step, epoch, data_wait_s, compute_s, samples FROM steps WHERE job_id = %s ORDER BY step",
                 job_id)
    assert [s[0] for s in steps] == list(range(6))
    assert all(s[1] == 0 and s[2] >= 0 and s[3] > 0 and s[4] == 8 for s in steps)
    assert {r[0] for r in rows(db, "SELECT name FROM metrics WHERE job_id = %s", job_id)} == {"loss"}
    profile = api(live_collector, f"/v1/jobs/{job_id}/profiles")["profiles"][0]
    assert profile["summary"]["framework"] == "pytorch" and profile["summary"]["steps"] == 2
    assert profile["summary"]["breakdown"]["data_loading_us"] > 0
    trace, _ = api(live_collector, profile["trace_url"])
    assert json.loads(trace)["traceEvents"]


def test_trace_over_the_cap_keeps_the_summary_with_a_note(live_collector: Any, job_id: str, tmp_path: Path) -> None:
    from jobsight.agent.training.profile_schedule import ProfileOptions

    jtorch.init(agent_settings(live_collector, job_id, tmp_path), on_demand=False)
    with jtorch.profiler(enabled=True, wait=0, warmup=1, active=1, options=ProfileOptions(trace_cap_bytes=100)) as p:
        for _ in range(2):
            torch.ones(4).mul(2)
            p.step()
    jtorch.finish()
    profile = wait_for(lambda: api(live_collector, f"/v1/jobs/{job_id}/profiles")["profiles"])[0]
    assert profile["trace_url"] is None and "over the cap" in profile["note"]
    assert profile["summary"]["ops_by_self_cpu"]
