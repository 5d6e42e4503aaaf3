"""A job's end state as Slurm names it: the collector keeps the most specific state it heard, in any
order the records arrive; the report says it as Slurm does; the audit counts the GPU-hours of jobs
ended at their time limit and of cancelled jobs, by user, account and partition."""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from jobsight.collector.query import audit as audit_queries
from jobsight.protocol.wire import now_us
from jobsight.rules import job_states
from jobsight.rules.report_text import format_report
from tests.collector.helpers import gz, post

S = 1_000_000


def _started(job: str, ts: int, **extra: Any) -> dict[str, Any]:
    return {"kind": "job_started", "job": job, "ts": ts, "node": "n1", "user": "alice", "nodes": ["n1"],
            "gpus": ["0", "1"], "time_limit_s": 60, **extra}


def _ended(job: str, ts: int, state: str | None, exit_code: int | None) -> dict[str, Any]:
    record: dict[str, Any] = {"kind": "job_ended", "job": job, "ts": ts, "node": "n1"}
    if state is not None:
        record["state"] = state
    if exit_code is not None:
        record["exit_code"] = exit_code
    return record


def _row(client: Any, job: str) -> tuple[str, int | None]:
    row = client.get(f"/v1/jobs/{job}").json()
    return row["state"], row["exit_code"]


# What one job's end may be heard as: a node whose epilog could not run scontrol (the environment's
# exit status alone), the epilog that asked scontrol (Slurm's TIMEOUT 0:15, or an OOM kill's 0:9 that
# the batch shell turned into 137), and the silent-node rule.
HEARD = {
    ("timeout", 143): [(None, 0), ("TIMEOUT", 143), ("lost", None)],
    ("out_of_memory", 137): [(None, 137), ("OUT_OF_MEMORY", 137), ("lost", None)],
}


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
@pytest.mark.parametrize("kept", list(HEARD))
def test_the_most_specific_state_is_kept_in_any_order(
    client: Any, job_id: str, kept: tuple[str, int], order: tuple[int, ...]
) -> None:
    t0 = now_us() - 600 * S
    assert post(client, gz([_started(job_id, t0)])).status_code == 200
    for i, index in enumerate(order):  # one batch each: records of different sources, in this order
        state, code = HEARD[kept][index]
        assert post(client, gz([_ended(job_id, t0 + (60 + i) * S, state, code)])).status_code == 200
    assert _row(client, job_id) == kept


@pytest.mark.parametrize(
    ("first", "second", "kept"),
    [
        # A failure's exit code is not replaced by a vaguer "completed" from another node.
        (("FAILED", 3), (None, 0), ("failed", 3)),
        ((None, 0), (None, 3), ("failed", 3)),
        # Slurm's OOM kill beats the exit status it caused (137), both ways.
        ((None, 137), ("OUT_OF_MEMORY", 137), ("out_of_memory", 137)),
        (("OUT_OF_MEMORY", 137), (None, 137), ("out_of_memory", 137)),
        # scancel beats the signal's exit status; a reconciled "lost" never replaces what Slurm said.
        (("CANCELLED", 143), ("FAILED", 143), ("cancelled", 143)),
        (("CANCELLED", 143), ("lost", None), ("cancelled", 143)),
        (("lost", None), ("CANCELLED by 0", 143), ("cancelled", 143)),
        # A time limit reached while a node failed: both are Slurm's own causes; the later one stays.
        (("NODE_FAIL", None), ("PREEMPTED", None), ("preempted", None)),
    ],
)
def test_a_vaguer_record_never_replaces_a_more_specific_state(
    client: Any, job_id: str, first: tuple[str | None, int | None], second: tuple[str | None, int | None],
    kept: tuple[str, int | None],
) -> None:
    t0 = now_us() - 600 * S
    assert post(client, gz([_started(job_id, t0), _ended(job_id, t0 + 60 * S, *first)])).status_code == 200
    assert post(client, gz([_ended(job_id, t0 + 61 * S, *second)])).status_code == 200
    assert _row(client, job_id) == kept


def test_a_job_started_again_after_an_end_is_not_running_again(client: Any, job_id: str) -> None:
    # Another node's prolog replayed late, after the epilog: the job stays ended.
    t0 = now_us() - 600 * S
    assert post(client, gz([_started(job_id, t0), _ended(job_id, t0 + 60 * S, "TIMEOUT", 143)])).status_code == 200
    assert post(client, gz([_started(job_id, t0 + S)], source="late-node")).status_code == 200
    assert _row(client, job_id) == ("timeout", 143)


def test_the_report_says_the_state_as_slurm_names_it(client: Any, job_id: str) -> None:
    t0 = now_us() - 600 * S
    assert post(client, gz([_started(job_id, t0), _ended(job_id, t0 + 60 * S, "TIMEOUT", 143)])).status_code == 200
    text = format_report(client.get(f"/v1/jobs/{job_id}").json(), client.get(f"/v1/jobs/{job_id}/summary").json())
    assert "State: TIMEOUT (signal 15)" in text
    assert job_states.describe("failed", 3) == "FAILED (exit code 3)"
    assert job_states.describe("out_of_memory", None) == "OUT_OF_MEMORY"
    assert job_states.describe("completed", 0) == "COMPLETED (exit code 0)"


def test_slurm_names_map_to_ours() -> None:
    assert [job_states.from_slurm(n) for n in ("TIMEOUT", "CANCELLED by 1000", "OUT_OF_MEMORY", "NODE_FAIL",
                                               "PREEMPTED", "REQUEUED", "BOOT_FAIL", "DEADLINE", "completed")] == [
        "timeout", "cancelled", "out_of_memory", "node_fail", "preempted", "requeued", "node_fail", "timeout",
        "completed"]
    assert [job_states.from_slurm(n) for n in ("RUNNING", "COMPLETING", "PENDING", "", "bogus")] == [None] * 5
    assert set(job_states.END_STATES) == set(job_states.SPECIFICITY)
    assert job_states.more_specific("running", "completed") == "completed"
    assert job_states.more_specific("timeout", "failed") == "timeout"


def test_silent_is_an_end_that_knows_nothing_of_how_the_run_ended() -> None:
    """A run outside Slurm ended for its silence (collector/passes/local_runs.py): any word heard later
    replaces it, and it replaces nothing but another word of silence. Listed wherever end states are."""
    assert job_states.is_end_state("silent") and "silent" in job_states.END_STATES
    assert job_states.from_slurm("silent") == "silent" and job_states.slurm_name("silent") == "SILENT"
    assert [job_states.more_specific("silent", heard) for heard in ("completed", "failed", "lost")] == [
        "completed", "failed", "lost"]
    assert [job_states.more_specific(stored, "silent") for stored in ("completed", "lost")] == ["completed", "silent"]


def test_the_audit_counts_gpu_hours_of_timeouts_and_cancelled_jobs(client: Any, database_url: str) -> None:
    # Users, accounts and partitions of its own: no other test's jobs in these rows.
    day = dt.datetime.combine(dt.datetime.now(dt.UTC).date() - dt.timedelta(days=3), dt.time(), dt.UTC)
    t0 = int(day.timestamp() * S) + 3600 * S
    tag = uuid.uuid4().hex[:8]
    bob, carol = f"bob-{tag}", f"carol-{tag}"
    jobs = [  # (user, account, partition, GPUs, hours, end as Slurm said it)
        (bob, f"physics-{tag}", f"gpu-{tag}", 2, 3, ("TIMEOUT", 143)),
        (bob, f"physics-{tag}", f"gpu-{tag}", 1, 1, ("CANCELLED", 143)),
        (carol, f"bio-{tag}", f"gpu-{tag}", 4, 2, ("CANCELLED", 143)),
        (carol, f"bio-{tag}", f"big-{tag}", 1, 5, ("FAILED", 1)),
        (carol, f"bio-{tag}", f"big-{tag}", 2, 1, (None, 0)),  # completed
    ]
    records = []
    for i, (user, account, partition, gpus, hours, end) in enumerate(jobs):
        job = f"audit-{tag}-{i}"
        records += [_started(job, t0, user=user, account=account, partition=partition,
                             gpus=[str(g) for g in range(gpus)]),
                    _ended(job, t0 + hours * 3600 * S, *end)]
    answer = post(client, gz(records))
    assert answer.status_code == 200, answer.text

    start, end = day, day + dt.timedelta(days=1)
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        by_user = {r["name"]: r for r in audit_queries.gpu_hours_by(conn, "user_name", start, end, cluster="default")}
        by_account = {r["name"]: r for r in audit_queries.gpu_hours_by(conn, "account", start, end,
                                                                         cluster="default")}
        by_partition = {r["name"]: r for r in audit_queries.gpu_hours_by(conn, "partition", start, end,
                                                                           cluster="default")}
    assert (by_user[bob]["timeout_gpu_hours"], by_user[bob]["cancelled_gpu_hours"]) == (6, 1)
    assert (by_user[carol]["timeout_gpu_hours"], by_user[carol]["cancelled_gpu_hours"]) == (0, 8)
    assert by_user[carol]["gpu_hours"] == 8 + 5 + 2
    assert by_account[f"physics-{tag}"]["timeout_gpu_hours"] == 6
    assert (by_partition[f"gpu-{tag}"]["timeout_gpu_hours"], by_partition[f"gpu-{tag}"]["cancelled_gpu_hours"]) == (
        6, 9)
    assert (by_partition[f"big-{tag}"]["timeout_gpu_hours"], by_partition[f"big-{tag}"]["cancelled_gpu_hours"]) == (
        0, 0)
