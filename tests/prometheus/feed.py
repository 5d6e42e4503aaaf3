"""A registered multi-GPU job fed to a collector as the node daemons and the training process send it:
through the agent's real :class:`~jobsight.agent.shipping.shipper.Shipper` (one per token: each node's
token for its node's records, the job's token for steps), with GPU samples read by the real pynvml over
the fake ``libnvidia-ml.so.1`` (tests/fake_nvml) and made into records as the node daemon makes them."""

from __future__ import annotations

import importlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from jobsight.agent.node.gpu.sampler import NvmlSampler
from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.shipper import Shipper
from jobsight.protocol.tokens import mint_job_token, mint_node_token
from jobsight.protocol.wire import now_us
from tests.collector.helpers import SECRET

GIB = 2**30
FLUSH_S = 30.0
SAMPLE_GAP_US = 5_000_000
"""The two GPU samples of a feed are this far apart (at now − gap and at now)."""
NOTHING_LOST = ("rejected_batches", "quarantined_batches", "dropped_records", "duplicate_batches", "queued",
                "spool_pending")
"""The shipper's counters that stay 0 when the collector took every record."""


@dataclass
class FedJob:
    job_id: str
    nodes: tuple[str, ...] = ("n1", "n2")
    gpus_per_node: int = 2
    ranks: int = 4
    user: str = "alice"
    account: str = "physics"
    partition: str = "gpu"
    name: str = "train"
    uid: int = 1001
    latest: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    """The latest GPU sample sent, by (node, GPU index)."""


def fake_library() -> Path:
    """The fake ``libnvidia-ml.so.1``, built if needed; skips the caller when pynvml or gcc is absent."""
    # By name: mypy takes the library's output folder tests/fake_nvml/build/ for the module build.py.
    builder = importlib.import_module("tests.fake_nvml.build")
    pytest.importorskip("pynvml", reason="nvidia-ml-py (pynvml) is not installed")
    try:
        return Path(builder.build_fake_nvml())
    except builder.GccMissing as exc:
        pytest.skip(f"cannot build the fake libnvidia-ml.so.1: {exc}")


def ship(base: str, token: str, node: str, records: list[dict[str, Any]]) -> None:
    """Sends ``records`` through a shipper of its own holding ``token``, and checks the collector took
    every one: flushed in time, nothing refused, quarantined, dropped or left waiting."""
    with tempfile.TemporaryDirectory(prefix="feed-shipper-") as folder:
        settings = AgentSettings(url=base, token=token, node=node, spool_dir=f"{folder}/spool",
                                 data_dir=f"{folder}/data", batch_age_s=0.05, http_timeout_s=15.0)
        shipper = Shipper(settings, use_spool=False)
        try:
            for record in records:
                shipper.enqueue(record)
            flushed = shipper.flush(FLUSH_S)
            stats = shipper.stats()
        finally:
            shipper.shutdown(5.0)
    assert flushed, stats
    assert stats["sent_records"] == len(records), stats
    assert {k: stats[k] for k in NOTHING_LOST} == dict.fromkeys(NOTHING_LOST, 0), stats


def scenario(job: FedJob, node: str) -> dict[str, Any]:
    """The fake NVML's GPUs of ``node``: two ticks (a sample each), the energy counter 2 kJ apart. The last GPU
    of the last node idles (an idle allocation); the first GPU of each node is power capped."""
    gpus = []
    for gpu in range(job.gpus_per_node):
        idle = node == job.nodes[-1] and gpu == job.gpus_per_node - 1
        gpus.append({
            "uuid": f"GPU-{node}-{gpu}", "name": "NVIDIA H100", "util_gpu": 0 if idle else 80 + gpu, "util_mem": 30,
            "mem_used": (10 + gpu) * GIB, "mem_total": 80 * GIB, "power_mw": 80_000 if idle else (400 + gpu) * 1000,
            "energy_mj": [1_000_000, 3_000_000], "temp_c": 60, "sm_clock_mhz": 1980 - gpu,
            "throttle_reasons": 0x4 if gpu == 0 else 0,  # 0x4: SW power cap
        })
    return {"driver_version": "550.54.15", "gpus": gpus}


@contextmanager
def nvml_of(job: FedJob, node: str) -> Iterator[NvmlSampler]:
    """A sampler over the fake NVML showing ``node``'s GPUs; NVML reads its scenario when it starts,
    so the variable is set around the sampler's life and put back after."""
    with tempfile.TemporaryDirectory(prefix="feed-nvml-") as folder:
        path = Path(folder) / f"{node}.json"
        path.write_text(json.dumps(scenario(job, node)))
        before = os.environ.get("FAKE_NVML_SCENARIO")
        os.environ["FAKE_NVML_SCENARIO"] = str(path)
        sampler = NvmlSampler(str(fake_library()))
        try:
            sampler.open()
            yield sampler
        finally:
            sampler.close()
            if before is None:
                del os.environ["FAKE_NVML_SCENARIO"]
            else:
                os.environ["FAKE_NVML_SCENARIO"] = before


def gpu_samples(job: FedJob, node: str, now: int) -> list[dict[str, Any]]:
    """Two samples of each of ``node``'s GPUs (the latest at ``now``), kept in ``job.latest`` as sent."""
    records: list[dict[str, Any]] = []
    with nvml_of(job, node) as sampler:
        for ts in (now - SAMPLE_GAP_US, now):
            readings = sampler.sample(range(job.gpus_per_node))
            assert [r.gpu_index for r in readings] == list(range(job.gpus_per_node)), readings
            for reading in readings:
                # As the node daemon's tick makes it (agent/node/daemon.py).
                sample = {"kind": "gpu_sample", "job": job.job_id, "ts": ts, "node": node, **reading.to_record()}
                records.append(sample)
                job.latest[(node, reading.gpu_index)] = sample
    return records


def feed(base: str, job: FedJob, *, steps_ago_s: float = 20.0, ended: bool = False) -> None:
    """Registers ``job`` and sends two GPU samples per GPU (the latest at now), a host sample per node
    with its energy share, and a run of steps on each rank that stopped ``steps_ago_s`` ago."""
    now = now_us()
    first = job.nodes[0]
    ship(base, mint_node_token(SECRET, "default", first), first, [{
        "kind": "job_started", "job": job.job_id, "ts": now - 60_000_000, "node": first, "user": job.user,
        "uid": job.uid, "account": job.account, "partition": job.partition, "name": job.name,
        "nodes": list(job.nodes), "node_count": len(job.nodes),
        "gpus": [str(g) for g in range(job.gpus_per_node)],
    }])
    for node in job.nodes:
        records = gpu_samples(job, node, now)
        records.append({"kind": "host_sample", "job": job.job_id, "ts": now, "node": node, "cpu_util": 100.0,
                        "energy_j": 500.0})
        ship(base, mint_node_token(SECRET, "default", node), node, records)
    start = now - int(steps_ago_s * 1e6) - 2_000_000
    steps = [{"kind": "step", "job": job.job_id, "ts": start + i * 100_000, "node": job.nodes[rank % len(job.nodes)],
              "rank": rank, "step": i, "duration_s": 0.1 * (1 + rank), "data_wait_s": 0.02 * (1 + rank)}
             for rank in range(job.ranks) for i in range(20)]
    ship(base, mint_job_token(SECRET, "default", job.job_id, 3600, uid=job.uid), first, steps)
    if ended:
        end(base, job)


def end(base: str, job: FedJob) -> None:
    first = job.nodes[0]
    ship(base, mint_node_token(SECRET, "default", first), first,
         [{"kind": "job_ended", "job": job.job_id, "ts": now_us(), "node": first, "state": "COMPLETED"}])
