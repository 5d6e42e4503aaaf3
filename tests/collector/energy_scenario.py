"""A fake-NVML scenario with known energy, sampled by the real node sampler, and a training run over it.

Three GPUs, sampled :data:`TICKS` times, :data:`INTERVAL_S` apart (the times are the test's: the
readings are the real sampler's over the fake libnvidia-ml.so.1). GPUs 0 and 1 have an energy
counter whose per-tick increments follow a power profile per interval; GPU 2 has none
(``nvmlDeviceGetTotalEnergyConsumption`` missing) and reads a power per tick.

The run: start-up (intervals 0–1), epoch 0 from sample 2, epoch 1 from sample 12, epoch 2 from
2 s after sample 20 (between samples: the interpolated case), the last step at sample 28, then
idle to sample 30. Two ranks step once a second, 8 samples a step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobsight.agent.node.gpu.reading import GpuReading
from jobsight.agent.node.gpu.sampler import NvmlSampler
from jobsight.protocol.wire import encode_batch
from tests.collector.helpers import next_seq, post

S = 1_000_000
TICKS = 31
INTERVAL_S = 5
EPOCH_STARTS_S = {0: 2 * INTERVAL_S, 1: 12 * INTERVAL_S, 2: 20 * INTERVAL_S + 2}
"""Seconds from the first sample to each epoch's first step."""
LAST_STEP_S = 28 * INTERVAL_S
RANKS = (0, 1)
SAMPLES_PER_STEP = 8
BASE_MJ = 123_456_789_012


def _interval_power(i: int, scale: float, offset: float) -> float:
    """GPU power (W) during interval ``i`` (sample ``i`` to ``i + 1``)."""
    profile = [5.0] * 2 + [300.0] * 10 + [500.0] * 8 + [450.0] + [400.0] * 7 + [5.0] * 2
    return profile[i] * scale + offset


COUNTER_GPUS = {0: (1.0, 0.0), 1: (0.6, 0.0)}
"""GPU index: (scale, offset) of its power profile."""


def counter_mj(gpu: int) -> list[int]:
    """The counter readings (mJ) the fake library gives GPU ``gpu`` at each tick."""
    scale, offset = COUNTER_GPUS[gpu]
    values = [BASE_MJ + gpu]
    for i in range(TICKS - 1):
        values.append(values[-1] + round(_interval_power(i, scale, offset) * INTERVAL_S * 1000))
    return values


def power_w(tick: int) -> float:
    """GPU 2's power reading at each tick (it has no counter)."""
    return 100.0 + 10.0 * (tick % 7) + (200.0 if 2 <= tick <= 28 else 0.0)


def scenario() -> dict[str, Any]:
    common = {"util_gpu": 90, "util_mem": 40, "mem_total": 85520809984, "mem_used": 42949672960, "temp_c": 60}
    gpus: list[dict[str, Any]] = [
        {**common, "uuid": f"GPU-{g}0000000-aaaa-bbbb-cccc-00000000000{g}", "name": "NVIDIA H100 80GB HBM3",
         "energy_mj": counter_mj(g), "power_mw": 300000} for g in COUNTER_GPUS
    ]
    gpus.append({**common, "uuid": "GPU-20000000-aaaa-bbbb-cccc-000000000002", "name": "Tesla P100-PCIE-16GB",
                 "power_mw": [round(power_w(t) * 1000) for t in range(TICKS)],
                 "missing": ["nvmlDeviceGetTotalEnergyConsumption"]})
    return {"driver_version": "550.54.15", "gpus": gpus}


def sample_scenario(library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[GpuReading]]:
    """:data:`TICKS` snapshots of every GPU by the real sampler over the fake library."""
    path = tmp_path / "energy.json"
    path.write_text(json.dumps(scenario()))
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(path))
    sampler = NvmlSampler(library_path=str(library))
    try:
        return [sampler.sample() for _ in range(TICKS)]
    finally:
        sampler.close()


def gpu_records(job: str, ticks: list[list[GpuReading]], gpus: set[int], t0: int, node: str = "n1",
                ticks_from: int = 0, ticks_to: int = TICKS, slower: int = 1) -> list[dict[str, Any]]:
    """The ``gpu_sample`` records the node daemon would send for ``gpus`` (ticks ``ticks_from`` to
    ``ticks_to``, excluded), tick ``i`` at ``t0 + i`` intervals (``slower`` times longer ones)."""
    return [{"kind": "gpu_sample", "job": job, "ts": t0 + i * INTERVAL_S * slower * S, "node": node, **r.to_record()}
            for i, readings in enumerate(ticks) if ticks_from <= i < ticks_to for r in readings if r.gpu_index in gpus]


def epoch_of(second: int) -> int:
    return max(e for e, start in EPOCH_STARTS_S.items() if start <= second)


def step_records(job: str, t0: int, node: str = "n1", from_s: int = 0, to_s: int = LAST_STEP_S,
                 slower: int = 1) -> list[dict[str, Any]]:
    """A step a second on each rank from epoch 0's start to the last step (``from_s`` to ``to_s``
    seconds after the first sample, both included), each 1 s long; with ``slower``, every time
    that many times later (as if the run were that much slower: samples stay where they were
    between epochs)."""
    first = EPOCH_STARTS_S[0]
    return [{"kind": "step", "job": job, "ts": t0 + second * slower * S, "node": node, "rank": rank,
             "step": second - first,
             "epoch": epoch_of(second), "phase": "train", "duration_s": 1.0, "samples": SAMPLES_PER_STEP}
            for second in range(max(first, from_s), min(to_s, LAST_STEP_S) + 1) for rank in RANKS]


def started(job: str, t0: int, user: str, gpus: list[str], node: str = "n1") -> dict[str, Any]:
    return {"kind": "job_started", "job": job, "ts": t0, "node": node, "user": user, "account": f"acct-{user}",
            "partition": "gpu", "nodes": [node], "node_count": 1, "gpus": gpus}


def ended(job: str, t0: int, node: str = "n1") -> dict[str, Any]:
    return {"kind": "job_ended", "job": job, "ts": t0 + ((TICKS - 1) * INTERVAL_S + 1) * S, "node": node,
            "exit_code": 0}


def send(client: Any, records: list[dict[str, Any]], cluster: str = "default") -> None:
    """Post ``records`` to the collector for ``cluster``, in batches the wire accepts."""
    for i in range(0, len(records), 5000):
        answer = post(client, encode_batch("energy-test", next_seq(), records[i:i + 5000], cluster))
        assert answer.status_code == 200, answer.text


# ---- what the fake library was given, per span ---------------------------------------------

def counter_j(gpu: int, from_s: float, to_s: float) -> float:
    """GPU ``gpu``'s counter delta (J) from ``from_s`` to ``to_s`` seconds after the first sample:
    whole intervals as scripted, and a boundary inside an interval at its share of it."""
    values = counter_mj(gpu)

    def at(second: float) -> float:
        i = min(int(second // INTERVAL_S), TICKS - 2)
        return values[i] + (values[i + 1] - values[i]) * (second - i * INTERVAL_S) / INTERVAL_S

    return (at(to_s) - at(from_s)) / 1000


def power_integral_j(from_s: float, to_s: float) -> float:
    """GPU 2's trapezoids from ``from_s`` to ``to_s`` (a part interval at its share of the trapezoid)."""

    def cumulative(second: float) -> float:
        i = min(int(second // INTERVAL_S), TICKS - 2)
        whole = sum(INTERVAL_S * (power_w(k) + power_w(k + 1)) / 2 for k in range(i))
        return whole + INTERVAL_S * (power_w(i) + power_w(i + 1)) / 2 * (second - i * INTERVAL_S) / INTERVAL_S

    return cumulative(to_s) - cumulative(from_s)


def epoch_spans_s() -> list[tuple[int, int, int]]:
    """(epoch, first second, end second) of each epoch."""
    starts = sorted(EPOCH_STARTS_S.items())
    return [(e, s, starts[i + 1][1] if i + 1 < len(starts) else LAST_STEP_S) for i, (e, s) in enumerate(starts)]
