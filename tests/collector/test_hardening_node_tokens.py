"""A node token writes only for jobs whose Slurm allocation holds its node: it cannot add
itself to another node's job, nor end it; a job the collector does not know yet stays open
to it (a prolog's record may still sit in a spool). A record it may not write is dropped and
named in the answer (``refused``); the rest of its batch is stored."""

from __future__ import annotations

from typing import Any

import psycopg

from jobsight.protocol.tokens import mint_job_token, mint_node_token
from jobsight.protocol.wire import encode_batch, now_us
from tests.collector.helpers import SECRET, next_seq, post


def send(client: Any, node: str, records: list[dict[str, Any]]) -> Any:
    token = mint_node_token(SECRET, "default", node)
    return post(client, encode_batch("hardening", next_seq(), records), Authorization=f"Bearer {token}")


def prolog(job: str, node: str, nodes: list[str]) -> dict[str, Any]:
    """What every node's prolog posts: the same allocation from each node."""
    return {"kind": "job_started", "job": job, "ts": now_us(), "node": node, "user": "alice", "nodes": nodes,
            "node_count": len(nodes), "gpus": ["0"]}


def sample(job: str, node: str) -> dict[str, Any]:
    return {"kind": "gpu_sample", "job": job, "ts": now_us(), "node": node, "gpu_index": 0, "gpu_uuid": "GPU-h",
            "util_gpu": 10.0}


def ended(job: str, node: str, exit_code: int = 1) -> dict[str, Any]:
    return {"kind": "job_ended", "job": job, "ts": now_us(), "node": node, "exit_code": exit_code}


def refused(response: Any) -> list[int]:
    """The indices of the records dropped from a node's batch (answered 200, the rest stored)."""
    assert response.status_code == 200, response.text
    return [r["index"] for r in response.json().get("refused", [])]


def reasons(response: Any) -> str:
    return " ".join(r["reason"] for r in response.json().get("refused", []))


def job_row(db: psycopg.Connection[Any], job: str) -> tuple[Any, ...]:
    return tuple(db.execute("SELECT nodes, state, gpus FROM jobs WHERE job_id = %s", (job,)).fetchone())


def test_a_node_cannot_add_itself_to_another_nodes_job(
    secret_client: Any, db: psycopg.Connection[Any], job_id: str
) -> None:
    assert send(secret_client, "n1", [prolog(job_id, "n1", ["n1"])]).status_code == 200
    takeover = [{"kind": "job_started", "job": job_id, "ts": now_us(), "node": "n2"}, sample(job_id, "n2")]
    response = send(secret_client, "n2", takeover)
    assert refused(response) == [0, 1] and "record 0" in reasons(response)
    # Naming an allocation that holds n2 changes nothing: the first prolog's is the job's.
    response = send(secret_client, "n2", [prolog(job_id, "n2", ["n1", "n2"]), sample(job_id, "n2")])
    assert refused(response) == [0, 1]
    response = send(secret_client, "n2", [ended(job_id, "n2")])
    assert refused(response) == [0] and "cannot end" in reasons(response)
    assert job_row(db, job_id) == (["n1"], "running", ["n1:0"])
    assert db.execute("SELECT count(*) FROM gpu_samples WHERE job_id = %s", (job_id,)).fetchone()[0] == 0


def test_a_node_of_the_allocation_cannot_widen_it(secret_client: Any, db: psycopg.Connection[Any], job_id: str) -> None:
    assert send(secret_client, "n1", [prolog(job_id, "n1", ["n1", "n2"])]).status_code == 200
    response = send(secret_client, "n2", [prolog(job_id, "n2", ["n1", "n2", "n3"])])
    assert refused(response) == [0] and "n3" in reasons(response)
    assert refused(send(secret_client, "n3", [sample(job_id, "n3")])) == [0]
    assert job_row(db, job_id)[0] == ["n1", "n2"]


def test_every_node_of_a_multi_node_allocation_registers_samples_and_ends(
    secret_client: Any, db: psycopg.Connection[Any], job_id: str
) -> None:
    nodes = ["n1", "n2", "n3"]
    for node in nodes:
        assert send(secret_client, node, [prolog(job_id, node, nodes), sample(job_id, node)]).status_code == 200
    for node in nodes:
        assert send(secret_client, node, [sample(job_id, node)]).status_code == 200
    assert send(secret_client, "n3", [ended(job_id, "n3", exit_code=0)]).status_code == 200
    assert job_row(db, job_id) == (nodes, "completed", ["n1:0", "n2:0", "n3:0"])


def test_a_job_not_known_yet_is_registered_by_a_prolog_of_its_allocation(
    secret_client: Any, db: psycopg.Connection[Any], job_id: str
) -> None:
    # After an outage the daemon's samples and the epilog can arrive before the prolog's record.
    assert send(secret_client, "n2", [sample(job_id, "n2")]).status_code == 200
    # The job's own run metadata (a job token) names the training host: not an allocation.
    run = {"kind": "job_started", "job": job_id, "ts": now_us(), "node": "n2.example.org", "name": "fit"}
    token = mint_job_token(SECRET, "default", job_id, 3600)
    assert post(secret_client, encode_batch("run", next_seq(), [run]),
                Authorization=f"Bearer {token}").status_code == 200
    # A prolog naming an allocation without its own node registers nothing.
    response = send(secret_client, "n2", [prolog(job_id, "n2", ["n1"])])
    assert refused(response) == [0] and "record 0" in reasons(response)
    # The real prolog: its allocation replaces the nodes seen before it.
    assert send(secret_client, "n2", [prolog(job_id, "n2", ["n1", "n2"])]).status_code == 200
    assert job_row(db, job_id)[0] == ["n1", "n2"]
    assert send(secret_client, "n1", [prolog(job_id, "n1", ["n1", "n2"]), sample(job_id, "n1")]).status_code == 200
    # Run metadata no longer changes the allocation, and cannot open the job to another node.
    elsewhere = {**run, "node": "n9", "ts": now_us(), "name": None}  # a registered job's name is Slurm's
    assert post(secret_client, encode_batch("run", next_seq(), [elsewhere]),
                Authorization=f"Bearer {token}").status_code == 200
    assert job_row(db, job_id)[0] == ["n1", "n2"]
    assert refused(send(secret_client, "n9", [ended(job_id, "n9")])) == [0]


def test_an_end_that_arrives_before_the_prolog_is_kept(
    secret_client: Any, db: psycopg.Connection[Any], job_id: str
) -> None:
    """The epilog posts directly while the prolog's job_started may still sit in the spool."""
    assert send(secret_client, "n1", [ended(job_id, "n1", exit_code=0)]).status_code == 200
    assert send(secret_client, "n1", [prolog(job_id, "n1", ["n1"])]).status_code == 200
    assert job_row(db, job_id)[:2] == (["n1"], "completed")
