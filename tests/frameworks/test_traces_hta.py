"""The per-rank traces of a two-process DDP run, downloaded from the collector as docs/training.md says,
open in Holistic Trace Analysis: one trace per rank, under the right rank, with its profiler steps.

On CPU there are no GPU kernels, so HTA's kernel breakdowns have nothing to read; what is checked
is that HTA parses each trace and files it under its own rank."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
hta_analysis = pytest.importorskip(
    "hta.trace_analysis", reason="HolisticTraceAnalysis (import hta) is not installed: pip install 'jobsight[dev]'"
)

from tests.frameworks.ddp_run import run_two_rank_ddp  # noqa: E402
from tests.frameworks.support import api, wait_for  # noqa: E402


def _download(live: Any, url: str, folder: Path) -> Path:
    """One trace as the API serves it, saved under the file name the answer gives."""
    request = urllib.request.Request(live.url + url, headers={"Authorization": f"Bearer {live.token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        disposition = response.headers["Content-Disposition"]
        body = response.read()
    name = re.fullmatch(r'attachment; filename="([^"/]+)"', disposition)
    assert name is not None, disposition
    path = folder / name.group(1)
    path.write_bytes(body)
    return path


def test_ddp_traces_from_the_collector_open_in_hta(live_collector: Any, job_id: str, tmp_path: Path) -> None:
    run_two_rank_ddp(live_collector, job_id, tmp_path)
    profiles = wait_for(lambda: (p := api(live_collector, f"/v1/jobs/{job_id}/profiles")["profiles"]) and len(p) == 2
                        and p)
    folder = tmp_path / "traces"
    folder.mkdir()
    files = {p["rank"]: _download(live_collector, p["trace_url"], folder) for p in profiles}
    assert sorted(files) == [0, 1]
    for rank, path in files.items():
        assert path.name.endswith(".pt.trace.json.gz") and f".rank{rank}." in path.name, path.name

    # include_last_profiler_step: HTA leaves the last step out by default (it may be cut short).
    analysis = hta_analysis.TraceAnalysis(trace_dir=str(folder), include_last_profiler_step=True)
    assert sorted(analysis.t.traces) == [0, 1]
    for rank, path in files.items():
        assert Path(analysis.t.trace_files[rank]).name == path.name  # each file under its own rank
        trace = analysis.t.get_trace(rank)
        names = set(trace["name"].map(analysis.t.symbol_table.get_sym_table().__getitem__))
        steps = {name for name in names if name.startswith("ProfilerStep#")}
        assert steps == {"ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"}, sorted(names)[:20]  # wait 1, warmup 1
    assert analysis.get_profiler_steps() == [2, 3, 4]
