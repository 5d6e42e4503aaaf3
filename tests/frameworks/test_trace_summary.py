"""The op summary from a Chrome trace alone (``summarize_trace``, what a process profiled by Kineto
on its own yields) agrees with the one from the torch profiler's own events (``summarize``) on a
real CPU profile: the same ops, calls and self times."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'jobsight[frameworks]')")

from jobsight.agent.traces.profile_summary import summarize, summarize_trace  # noqa: E402


def test_the_traces_summary_matches_the_profilers(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(32, 64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            optimizer.zero_grad()
            model(batch).sum().backward()
            optimizer.step()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]

    from_trace = summarize_trace(events, steps=3)
    from_profiler = summarize(prof, steps=3)
    trace_rows = {r["name"]: r for r in from_trace["ops_by_self_cpu"]}
    profiler_rows = {r["name"]: r for r in from_profiler["ops_by_self_cpu"]}
    # The ops that cost most are found either way, with the same calls and about the same self time.
    for name in ("aten::addmm", "aten::mm"):
        assert name in trace_rows and name in profiler_rows, (sorted(trace_rows), sorted(profiler_rows))
        assert trace_rows[name]["calls"] == profiler_rows[name]["calls"]
        assert trace_rows[name]["self_cpu_us"] == pytest.approx(profiler_rows[name]["self_cpu_us"], rel=0.1, abs=5)
    assert from_trace["self_cpu_total_us"] == pytest.approx(from_profiler["self_cpu_total_us"], rel=0.15)
    assert from_trace["ops_by_self_device"] == [] and from_trace["steps"] == 3
