"""An ``squeue`` for the hooks' tests where no slurmctld answers: a script that prints, for the job
it is asked about (``squeue --json -j <id>``), one job in the shape Slurm 22.05's ``squeue --json``
prints (data_parser v0.0.38: the fields below were read from the test cluster's real answers).
On a real cluster the hooks ask the real one: tests/slurm/test_e2e.py and its neighbours."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Slurm 22.05's answer for a running one-GPU job, the fields the hooks read and a few beside them.
BASE: dict[str, Any] = {
    "account": "", "array_job_id": 0, "array_task_id": None, "derived_exit_code": 0, "exit_code": 0,
    "group_id": 0, "het_job_id": 0, "job_state": "RUNNING", "name": "my job", "nodes": "vm",
    "partition": "gpu", "restart_cnt": 0, "state_reason": "None", "time_limit": 30, "user_id": 65534,
    "user_name": "nobody",
}


def wait_status(code: int, signal: int = 0) -> int:
    """The raw wait status 22.05 prints as ``exit_code`` (exit 3 → 768, signal 15 → 15)."""
    return (code << 8) | signal


def squeue_stub(directory: Path, job: dict[str, Any] | None, *, hang: bool = False, name: str = "squeue") -> str:
    """Write the stub into ``directory`` and return its path. ``job``: fields over :data:`BASE`;
    ``None``: the job is unknown (an empty list, as squeue answers for a forgotten job)."""
    script = directory / name
    if hang:
        body = "exec /bin/sleep 30\n"
    elif job is None:
        body = "echo '{\"meta\": {}, \"errors\": [], \"jobs\": []}'\n"
    else:
        # The job id is the one asked for ($3 of `squeue --json -j ID`): the stub stands for any job.
        answer = json.dumps({"meta": {}, "errors": [], "jobs": [{**BASE, **job, "job_id": 123456789}]})
        head, tail = answer.split("123456789", 1)
        body = f"printf '%s%s%s\\n' '{_quoted(head)}' \"$3\" '{_quoted(tail)}'\n"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return str(script)


def _quoted(text: str) -> str:
    """``text`` inside a single-quoted shell word."""
    return text.replace("'", "'\"'\"'")
