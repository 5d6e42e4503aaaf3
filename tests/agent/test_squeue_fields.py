"""What the prolog takes from ``squeue --json`` for waste policies: the batch flag, QOS and comment,
each only when Slurm gave it in its own type (a comment is text, never parsed)."""

from __future__ import annotations

from typing import Any

from jobsight.agent.slurm.squeue import job_fields
from tests.slurm.squeue_stub import BASE


def answer(**fields: Any) -> dict[str, Any]:
    return {"jobs": [{**BASE, "job_id": 77, **fields}]}


def test_batch_qos_and_comment_come_from_slurms_answer() -> None:
    got = job_fields(answer(batch_flag=False, qos="normal", comment="keep-me BatchFlag=1"), "77")
    assert (got["batch"], got["qos"], got["comment"]) == ("false", "normal", "keep-me BatchFlag=1")
    assert job_fields(answer(batch_flag=True), "77")["batch"] == "true"


def test_missing_or_mistyped_values_are_left_out() -> None:
    got = job_fields(answer(batch_flag="false", qos="", comment=7), "77")
    assert not {"batch", "qos", "comment"} & set(got)
