"""Diagnosis rules: the per-token loss loop found by a real profile, and each rule's evidence."""

from __future__ import annotations

import json
import tempfile
from typing import Any

import pytest

from jobsight.agent.training.profile_summary import breakdown, summarize
from jobsight.protocol.diagnosis import diagnose

torch = pytest.importorskip("torch")

VOCAB, SEQ, BATCH = 32, 128, 4


def profile_lm(per_token: bool, steps: int = 3) -> dict[str, Any]:
    """Profile a tiny language model's training steps; the loss per token in a Python loop or batched."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, VOCAB))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=steps, repeat=1)
    with torch.profiler.profile(schedule=schedule, record_shapes=True) as prof:
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
    assert loop["evidence"]["calls_per_step"] >= SEQ
    assert loop["evidence"]["steps"] == 3
    assert "per step" in loop["message"]


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
