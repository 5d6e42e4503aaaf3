"""Diagnosis rules: the per-token loss loop found by a real profile, and each rule's evidence."""

from __future__ import annotations

import inspect
import json
import tempfile
from typing import Any

import pytest

from jobsight.agent.traces.profile_summary import breakdown, summarize
from jobsight.protocol.diagnosis import diagnose

torch = pytest.importorskip("torch")

VOCAB, SEQ, BATCH = 32, 128, 4


def profile_lm(per_token: bool, steps: int = 3, with_stack: bool = True) -> dict[str, Any]:
    """Profile a tiny language model's training steps; the loss per token in a Python loop or batched."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, VOCAB))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=steps, repeat=1)
    with torch.profiler.profile(schedule=schedule, record_shapes=True, with_stack=with_stack) as prof:
        for _ in range(steps + 1):
            logits = model(inputs)
            if per_token:
                loss = torch.zeros(())
                for t in range(SEQ):
                    loss = loss + torch.nn.functional.cross_entropy(logits[:, t], targets[:, t])
                loss = loss / SEQ
            else:
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    with tempfile.NamedTemporaryFile(suffix=".json") as handle:
        prof.export_chrome_trace(handle.name)
        events = json.load(open(handle.name))["traceEvents"]
    summary = summarize(prof, steps)
    summary["breakdown"] = breakdown(events)
    summary["device"] = "cpu"
    return summary


def test_per_token_loss_loop_gets_the_python_loop_hint() -> None:
    hints = {h["rule"]: h for h in diagnose(profile=profile_lm(per_token=True))}
    loop = hints["python_loop"]
    lines, first = inspect.getsourcelines(profile_lm)
    call_line = first + next(i for i, line in enumerate(lines) if "functional.cross_entropy(logits[:, t]" in line)
    assert loop["evidence"]["site"] == f"test_diagnosis.py:{call_line} cross_entropy ×{SEQ}/step"
    assert loop["evidence"]["calls_per_step"] == SEQ and loop["evidence"]["function"] == "profile_lm"
    assert loop["evidence"]["steps"] == 3
    assert "per step" in loop["message"]


def test_without_stacks_no_line_is_known_and_no_loop_is_claimed() -> None:
    summary = profile_lm(per_token=True, with_stack=False)
    assert summary["stacks"] is False and max(op["calls_per_step"] for op in summary["most_called"]) >= SEQ
    assert all(op["source"] is None for op in summary["most_called"])
    assert "python_loop" not in {h["rule"] for h in diagnose(profile=summary)}


def test_batched_loss_does_not() -> None:
    summary = profile_lm(per_token=False)
    assert "python_loop" not in {h["rule"] for h in diagnose(profile=summary)}
    assert max(op["calls_per_step"] for op in summary["most_called"]) < 100


def test_job_rules_carry_their_evidence() -> None:
    steps = [{"rank": r, "duration_s": 0.1 if r != 3 else 0.2, "data_wait_s": 0.03} for r in range(4) for _ in range(5)]
    samples = [{"util_gpu": 2.0, "mem_used": 79, "mem_total": 80} for _ in range(5)]
    hints = {h["rule"]: h for h in diagnose(steps=steps, gpu_samples=samples)}
    assert hints["straggler"]["evidence"]["rank"] == 3
    assert hints["straggler"]["evidence"]["ratio"] == pytest.approx(2.0)
    assert hints["input_bound"]["evidence"]["data_wait_share"] == pytest.approx(0.24, abs=0.01)
    assert hints["idle_gpu"]["evidence"]["mean_util"] == 2.0
    assert hints["memory_pressure"]["evidence"]["max_memory_share"] > 0.95
    balanced = [{"rank": r, "duration_s": 0.1, "data_wait_s": 0.0} for r in range(4) for _ in range(5)]
    assert diagnose(steps=balanced) == []


def test_profile_rules_on_a_gpu_summary() -> None:
    summary = {
        "steps": 4, "device": "cuda", "precision": "32-true", "self_cpu_total_us": 1000.0,
        "self_device_total_us": 1000.0, "most_called": [],
        "ops_by_self_device": [{"name": "sm90_xmma_gemm_f32f32", "self_device_us": 700.0}],
        "breakdown": {"basis": "device", "idle_share": 0.6, "kernel_mean_us": 5.0, "kernel_count": 4000,
                      "communication_share": 0.35, "comm_overlap": 0.1, "data_loading_share": 0.25},
        "memory": {"total_bytes": 100, "peak_reserved_bytes": 97, "alloc_retries": 3, "ooms": 0},
    }
    rules = {h["rule"]: h for h in diagnose(profile=summary)}
    assert set(rules) == {"input_bound", "launch_bound", "no_mixed_precision", "communication_bound",
                          "memory_pressure", "idle_gpu"}
    assert rules["launch_bound"]["evidence"]["kernels_per_step"] == 1000
    assert rules["communication_bound"]["evidence"]["comm_overlap"] == 0.1
    summary["precision"] = "bf16-mixed"
    assert "no_mixed_precision" not in {h["rule"] for h in diagnose(profile=summary)}


def _breakdown(share: float, overlap: float = 0.1) -> dict[str, Any]:
    return {"breakdown": {"communication_share": share, "comm_overlap": overlap}}


def test_across_ranks_a_rank_that_does_not_wait_is_the_straggler() -> None:
    profiles = {0: _breakdown(0.72), 1: _breakdown(0.05), 2: _breakdown(0.70)}
    hints = {h["rule"]: h for h in diagnose(rank_profiles=profiles)}
    assert set(hints) == {"straggler"}
    evidence = hints["straggler"]["evidence"]
    assert (evidence["rank"], evidence["rank_share"], evidence["waiting_rank"], evidence["waiting_share"]) == (
        1, 0.05, 0, 0.72)
    assert evidence["communication_share_by_rank"] == {"0": 0.72, "1": 0.05, "2": 0.70}
    assert "5%" in hints["straggler"]["message"] and "72%" in hints["straggler"]["message"]


def test_across_ranks_communication_bound_only_when_every_rank_waits_alike() -> None:
    alike = {h["rule"]: h for h in diagnose(rank_profiles={0: _breakdown(0.62), 1: _breakdown(0.55)})}
    assert set(alike) == {"communication_bound"}
    assert alike["communication_bound"]["evidence"]["communication_share_by_rank"] == {"0": 0.62, "1": 0.55}
    # Overlapped with compute, or under the share on one rank without a clear straggler: no verdict.
    assert diagnose(rank_profiles={0: _breakdown(0.62, 0.8), 1: _breakdown(0.55, 0.8)}) == []
    assert diagnose(rank_profiles={0: _breakdown(0.40), 1: _breakdown(0.25)}) == []
    # One rank's profile alone says what it sees, and says it is one rank's view.
    one = {h["rule"]: h for h in diagnose(profile={**_breakdown(0.62), "world_size": 2})}
    assert "one rank's view" in one["communication_bound"]["message"]


def test_the_step_straggler_compares_own_work_when_every_rank_has_forward() -> None:
    """Synchronous DDP: alike step times, rank 2's data wait + forward is twice the others'."""
    steps = [{"rank": r, "duration_s": 0.2, "data_wait_s": 0.01, "forward_s": 0.1 if r == 2 else 0.04}
             for r in range(4) for _ in range(5)]
    straggler = {h["rule"]: h for h in diagnose(steps=steps)}["straggler"]
    assert straggler["evidence"]["rank"] == 2 and straggler["evidence"]["quantity"] == "data_wait_s + forward_s"
    assert straggler["evidence"]["rank_median_s"] == pytest.approx(0.11)
    assert "data wait + forward" in straggler["message"]
    # A rank without forward_s (a plain torch loop): step time is what every rank has.
    mixed = [dict(s, forward_s=None) if s["rank"] == 0 else s for s in steps]
    assert "straggler" not in {h["rule"] for h in diagnose(steps=mixed)}
