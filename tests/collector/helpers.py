"""Building batches for collector tests."""

from __future__ import annotations

import base64
import gzip
import itertools
import json
from typing import Any

from jobsight.protocol.wire import encode_batch, now_us

_seq = itertools.count(1)

SECRET = "test-cluster-secret-0123456789"
"""The cluster secret of the ``secret_client`` fixture (tests/collector/conftest.py)."""


def next_seq() -> int:
    return next(_seq)


def gz(records: list[dict[str, Any]], source: str = "test-source", seq: int | None = None) -> bytes:
    return encode_batch(source, next_seq() if seq is None else seq, records)


def raw_gz(envelope: Any) -> bytes:
    return gzip.compress(json.dumps(envelope).encode())


def post(client: Any, body: bytes, **headers: str) -> Any:
    return client.post("/v1/ingest", content=body, headers={"Content-Encoding": "gzip", **headers})


def one_of_each(job: str, ts: int | None = None) -> list[dict[str, Any]]:
    """One record of every kind for ``job``, with every optional field filled."""
    ts = ts or now_us()
    return [
        {
            "kind": "job_started",
            "job": job,
            "ts": ts,
            "node": "n1",
            "user": "alice",
            "uid": 1001,
            "account": "ml",
            "partition": "gpu",
            "name": "train",
            "nodes": ["n1"],
            "node_count": 1,
            "gpus": ["0", "1"],
            "time_limit_s": 3600,
            "demo": False,
            "attrs": {"qos": "normal"},
        },
        {
            "kind": "gpu_sample",
            "job": job,
            "ts": ts + 1,
            "node": "n1",
            "gpu_index": 0,
            "gpu_uuid": "GPU-aaa",
            "gpu_name": "NVIDIA H100",
            "mig_uuid": None,
            "util_gpu": 87.0,
            "util_mem": 40.0,
            "mem_used": 40 * 2**30,
            "mem_total": 80 * 2**30,
            "power_w": 512.5,
            "energy_j": 123456.5,
            "temp_c": 61.0,
            "sm_clock_mhz": 1980,
            "mem_clock_mhz": 2619,
            "pcie_tx_kbs": 1200,
            "pcie_rx_kbs": 3400,
            "throttle_reasons": 4,
            "ecc_errors": 0,
            "process_count": 1,
            "sm_active": 0.8,
            "tensor_active": 0.5,
            "lost": False,
            "nvlink_crc_errors": 12,
            "nvlink_replay_errors": 3,
            "nvlink_recovery_errors": 1,
            "pcie_replays": 2**32 - 1,
            "remapped_rows_pending": True,
            "remap_failure": False,
            "retired_pages_pending": False,
        },
        {
            "kind": "gpu_event",
            "job": job,
            "ts": ts + 1,
            "node": "n1",
            "gpu_index": 0,
            "gpu_uuid": "GPU-aaa",
            "event": "xid",
            "code": 79,
        },
        {
            "kind": "host_sample",
            "job": job,
            "ts": ts + 2,
            "node": "n1",
            "cpu_util": 350.0,
            "cpu_time_s": 12.5,
            "mem_used": 2**33,
            "mem_limit": 2**35,
        },
        {
            "kind": "log",
            "job": job,
            "ts": ts + 3,
            "node": "n1",
            "rank": 0,
            "pid": 4242,
            "tid": 4243,
            "thread": "MainThread",
            "level": "ERROR",
            "logger": "train",
            "message": "loss is nan",
            "exception": "Traceback ...\nValueError: nan",
            "attrs": {"step": 7, "lr": 0.001},
        },
        {
            "kind": "metric",
            "job": job,
            "ts": ts + 4,
            "node": "n1",
            "rank": 0,
            "pid": 4242,
            "tid": 4243,
            "step": 7,
            "name": "loss",
            "value": 2.5,
        },
        {
            "kind": "step",
            "job": job,
            "ts": ts + 5,
            "node": "n1",
            "rank": 0,
            "pid": 4242,
            "tid": 4243,
            "step": 7,
            "epoch": 1,
            "phase": "train",
            "duration_s": 0.021,
            "data_wait_s": 0.004,
            "compute_s": 0.017,
            "samples": 32,
        },
        {
            "kind": "profile",
            "job": job,
            "ts": ts + 6,
            "node": "n1",
            "rank": 0,
            "pid": 4242,
            "profile_id": "p1",
            "request_id": None,
            "step_start": 5,
            "step_end": 8,
            "summary": {"top_ops": [{"name": "aten::mm"}]},
            "diagnosis": [{"rule": "input_bound"}],
            "trace_gz_b64": base64.b64encode(gzip.compress(b'{"traceEvents": []}')).decode(),
            "note": None,
        },
        {"kind": "dropped", "job": job, "ts": ts + 7, "node": "n1", "count": 12, "reason": "spool full"},
        {"kind": "job_ended", "job": job, "ts": ts + 8, "node": "n1", "exit_code": 0, "state": None},
    ]
