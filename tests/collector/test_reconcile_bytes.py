"""Reconciliation reads Slurm's answers as text whatever bytes one user's job name holds: a name that
is not UTF-8 made ``squeue --json`` unreadable as a whole, and the pass failed for every job of the
cluster (docs/security.md, boundary 1); ``sacct`` goes through the same reader. Slurm's commands
are scripts printing what Slurm 22.05 prints for such a name (the bytes as they are), as
test_reconcile.py stands in for them."""

from __future__ import annotations

import json
from pathlib import Path

from jobsight.collector.passes.slurm_jobs import ask_sacct, ask_squeue

BAD = b"bad\xff\xfe name"


def _script(folder: Path, name: str, output: bytes) -> str:
    data = folder / f"{name}.out"
    data.write_bytes(output)
    script = folder / name
    script.write_text(f"#!/bin/sh\ncat {data}\n")
    script.chmod(0o755)
    return str(script)


def test_squeue_with_a_name_that_is_not_utf8_answers_for_every_job(tmp_path: Path) -> None:
    jobs = [{"job_id": 77, "name": "NAME", "job_state": "CANCELLED", "exit_code": 15, "array_job_id": 0,
             "het_job_id": 0, "start_time": 1795425352, "end_time": 1795425362},
            {"job_id": 78, "name": "plain", "job_state": "FAILED", "exit_code": 768, "array_job_id": 0,
             "het_job_id": 0, "start_time": 1795425352, "end_time": 1795425353}]
    text = json.dumps({"meta": {}, "errors": [], "jobs": jobs}).encode().replace(b"NAME", BAD)
    got = ask_squeue(_script(tmp_path, "squeue", text), 10)
    assert {job: record.end_state for job, record in got.items()} == {"77": "cancelled", "78": "failed"}


def test_a_stray_byte_in_sacct_output_loses_no_other_line(tmp_path: Path) -> None:
    lines = b"77|CANCELLED by 0|0:15|1795425352|1795425362\n78|FAILED|3:0|1795425352|1795425353\n" + BAD + b"\n"
    got = ask_sacct(_script(tmp_path, "sacct", lines), ["77", "78"], 10)
    assert {job: record.end_state for job, record in got.items()} == {"77": "cancelled", "78": "failed"}
