"""The per-process allocation cache: one read for the jobs it lacks, kept for its TTL, a job
forgotten when its prolog is stored, and bounded."""

from __future__ import annotations

from typing import Any

import psycopg

from jobsight.collector.jobs.allocations import Allocation, AllocationCache
from tests.collector.test_hardening_node_tokens import prolog, sample, send


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Database:
    """Stands for the jobs table: what it holds and the reads made of it."""

    def __init__(self, rows: dict[str, Allocation]) -> None:
        self.rows = rows
        self.reads: list[list[str]] = []

    def read(self, cluster: str, jobs: list[str]) -> dict[str, Allocation]:
        self.reads.append(list(jobs))
        return {job: self.rows[job] for job in jobs if job in self.rows}


def test_reads_only_what_it_lacks_and_keeps_it_for_the_ttl() -> None:
    clock, db = Clock(), Database({"1": ["n1"], "2": None})
    cache = AllocationCache(ttl_s=30, clock=clock)
    assert cache.get("c", ["1", "2", "3"], db.read) == {"1": ["n1"], "2": None}
    assert cache.get("c", ["1", "2", "3"], db.read) == {"1": ["n1"], "2": None}
    assert db.reads == [["1", "2", "3"], ["3"]]  # an unknown job is asked again: its prolog may be on its way
    db.rows["1"] = ["n1", "n2"]
    clock.now += 29
    assert cache.get("c", ["1"], db.read) == {"1": ["n1"]}
    clock.now += 2
    assert cache.get("c", ["1"], db.read) == {"1": ["n1", "n2"]}
    assert cache.get("other", ["1"], db.read) == {"1": ["n1", "n2"]} and db.reads[-1] == ["1"]


def test_forget_and_bound() -> None:
    db = Database({str(n): [f"n{n}"] for n in range(10)})
    cache = AllocationCache(max_jobs=4)
    cache.get("c", [str(n) for n in range(10)], db.read)
    db.reads.clear()
    cache.get("c", ["9", "6"], db.read)
    assert db.reads == []
    cache.get("c", ["0"], db.read)
    assert db.reads == [["0"]]
    cache.forget("c", ["9"])
    cache.get("c", ["9"], db.read)
    assert db.reads == [["0"], ["9"]]


def test_a_registration_is_seen_at_once_by_the_process_that_stored_it(
    secret_client: Any, db: psycopg.Connection[Any], job_id: str
) -> None:
    """Samples come before the prolog (job known, allocation not yet): then the prolog names
    n1 only, and n2, accepted a moment before, has its record refused on its very next batch."""
    assert send(secret_client, "n2", [sample(job_id, "n2")]).status_code == 200
    assert send(secret_client, "n2", [sample(job_id, "n2")]).status_code == 200
    assert send(secret_client, "n1", [prolog(job_id, "n1", ["n1"])]).status_code == 200
    refused = send(secret_client, "n2", [sample(job_id, "n2")])
    assert refused.status_code == 200 and [r["index"] for r in refused.json()["refused"]] == [0], refused.text
    assert send(secret_client, "n1", [sample(job_id, "n1")]).status_code == 200


def test_cached_answers_only_when_every_job_is_fresh() -> None:
    clock, db = Clock(), Database({"1": ["n1"], "2": None})
    cache = AllocationCache(ttl_s=30, clock=clock)
    assert cache.cached("c", ["1"]) is None
    cache.get("c", ["1", "2"], db.read)
    assert cache.cached("c", ["1", "2"]) == {"1": ["n1"], "2": None}
    assert cache.cached("c", ["1", "3"]) is None
    clock.now += 30
    assert cache.cached("c", ["1"]) is None
