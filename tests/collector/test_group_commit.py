"""Group commit against the real database: batches posted at once share a transaction, and
each still gets its own answer, is stored once, and stores all of its rows or none.

With one writer thread, held on its first group (``HeldWriter``) while the other requests
queue, which batches share the next group is certain, not a matter of timing; with the
default writers, many nodes posting at once still store each batch exactly once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from jobsight.protocol.wire import now_us
from tests.collector.helpers import gz, post

HOLD_S = 30.0
"""How long anything here waits; only reached when a test is failing."""


class HeldWriter:
    """``ingest.store_group`` recording the size of every group, its first call held until
    :meth:`release`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from jobsight.collector.ingest import write as ingest

        self._store_group = ingest.store_group
        self.sizes: list[int] = []
        self.entered = threading.Event()
        self._released = threading.Event()
        monkeypatch.setattr(ingest, "store_group", self._held)

    def _held(self, conn: Any, items: Any, jobs: Any = None) -> Any:
        self.sizes.append(len(items))
        if not self.entered.is_set():
            self.entered.set()
            self._released.wait(HOLD_S)
        return self._store_group(conn, items, jobs)

    def release(self) -> None:
        self._released.set()


def _wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + HOLD_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@contextmanager
def collector(database_url: str, data_dir: Path, admin_token: str, **settings: Any) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from jobsight.collector.app import create_app
    from jobsight.collector.config.settings import load_collector_settings

    app = create_app(load_collector_settings(database_url=database_url, data_dir=data_dir, **settings))
    with TestClient(app, raise_server_exceptions=False) as client:
        client.headers["Authorization"] = f"Bearer {admin_token}"
        yield client


@pytest.fixture
def one_writer(database_url: str, data_dir: Path, admin_token: str) -> Iterator[Any]:
    with collector(database_url, data_dir, admin_token, group_commit_writers=1) as client:
        yield client


def post_in_one_group(client: Any, monkeypatch: pytest.MonkeyPatch, first: bytes, rest: list[bytes]) -> tuple[
        Any, list[Any], HeldWriter]:
    """Post ``first``, hold the writer on it, queue all of ``rest``, then let the writer go:
    ``rest`` is the second group. Returns the answers and the writer's record."""
    held = HeldWriter(monkeypatch)
    committer = client.app.state.group_commit
    with ThreadPoolExecutor(len(rest) + 1) as pool:
        first_answer = pool.submit(post, client, first)
        assert held.entered.wait(HOLD_S), "the first batch never reached the writer"
        answers = [pool.submit(post, client, body) for body in rest]
        try:
            _wait_for(lambda: committer.queued == len(rest), f"{len(rest)} batches to queue")
        finally:
            held.release()
        return first_answer.result(HOLD_S), [a.result(HOLD_S) for a in answers], held


def _gpu(job: str, node: str, ts: int, util: float = 50.0) -> dict[str, Any]:
    return {"kind": "gpu_sample", "job": job, "ts": ts, "node": node, "gpu_index": 0, "gpu_uuid": f"GPU-{node}",
            "util_gpu": util, "power_w": 300.0, "mem_used": 2**30, "mem_total": 2**34}


def _log(job: str, node: str, ts: int, message: str) -> dict[str, Any]:
    return {"kind": "log", "job": job, "ts": ts, "node": node, "level": "INFO", "message": message}


def _node_batch(job: str, node: int, ts: int, samples: int = 8, message: str = "ok") -> list[dict[str, Any]]:
    """What a node sends: ``samples`` GPU samples a second apart, and one log line."""
    name = f"n{node:02d}"
    return [*(_gpu(job, name, ts + i * 1_000_000, float(i)) for i in range(samples)), _log(job, name, ts, message)]


def _count(db: psycopg.Connection[Any], table: str, job: str) -> int:
    return int(db.execute(f"SELECT count(*) FROM {table} WHERE job_id = %s", (job,)).fetchone()[0])


def test_concurrent_batches_share_a_group_and_each_is_stored_once(
    one_writer: Any, db: psycopg.Connection[Any], job_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = one_writer
    t0 = now_us() - 600_000_000
    first = gz(_node_batch(job_id, 0, t0), source=f"{job_id}-n00", seq=1)
    nodes = [gz(_node_batch(job_id, n, t0), source=f"{job_id}-n{n:02d}", seq=1) for n in range(1, 21)]
    # A batch sent twice inside the group, and the held batch sent again (a replay across groups).
    twice = gz(_node_batch(job_id, 21, t0), source=f"{job_id}-n21", seq=1)
    first_answer, answers, held = post_in_one_group(client, monkeypatch, first, [*nodes, twice, twice, first])

    assert held.sizes == [1, 23], "the queued batches should have been written as one group"
    assert first_answer.status_code == 200 and first_answer.json()["status"] == "stored"
    statuses = [a.json()["status"] for a in answers]
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert statuses[:20] == ["stored"] * 20
    assert sorted(statuses[20:22]) == ["duplicate", "stored"]
    assert statuses[22] == "duplicate"
    assert [a.json()["records"] for a in answers][:20] == [9] * 20

    # 22 distinct node batches of 8 samples and a log line each, every row exactly once.
    assert _count(db, "gpu_samples", job_id) == 22 * 8
    assert _count(db, "log_events", job_id) == 22
    rolled = db.execute("SELECT sum(samples), count(DISTINCT node) FROM gpu_minutes WHERE job_id = %s",
                        (job_id,)).fetchone()
    assert rolled == (22 * 8, 22)
    assert db.execute("SELECT count(*) FROM ingest_batches WHERE source LIKE %s", (f"{job_id}-%",)
                      ).fetchone()[0] == 22
    assert _count(db, "jobs", job_id) == 1


@pytest.fixture
def poison_triggers(database_url: str, job_id: str) -> Iterator[dict[str, str]]:
    """PostgreSQL refusing one log message of this test's job with a plain exception (the
    collector answers 500) and another with a data error (SQLSTATE 22003: 422), as a bug or a
    value that slipped past validation would. Yields the two messages and the trigger's name."""
    name = f"jobsight_test_group_{uuid4().hex[:12]}"
    markers = {"bug": f"bug-{name}", "data": f"data-{name}", "trigger": name}
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            f" IF NEW.message = '{markers['data']}' THEN"
            f"  RAISE EXCEPTION 'value out of range' USING ERRCODE = 'numeric_value_out_of_range';"
            f" END IF;"
            f" RAISE EXCEPTION 'poison record of job %', NEW.job_id; END $$"
        )
        conn.execute(
            f"CREATE TRIGGER {name} BEFORE INSERT ON log_events FOR EACH ROW"
            f" WHEN (NEW.job_id = '{job_id}' AND NEW.message IN ('{markers['bug']}', '{markers['data']}'))"
            f" EXECUTE FUNCTION {name}()"
        )
    try:
        yield markers
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"DROP TRIGGER IF EXISTS {name} ON log_events")
            conn.execute(f"DROP FUNCTION IF EXISTS {name}()")


def test_a_failing_batch_does_not_fail_the_others_in_its_group(
    one_writer: Any, db: psycopg.Connection[Any], job_id: str, monkeypatch: pytest.MonkeyPatch,
    poison_triggers: dict[str, str]
) -> None:
    client = one_writer
    t0 = now_us() - 300_000_000
    first = gz(_node_batch(job_id, 0, t0), source=f"{job_id}-n00", seq=1)
    good = [gz(_node_batch(job_id, n, t0), source=f"{job_id}-n{n:02d}", seq=1) for n in range(1, 5)]
    bug = gz(_node_batch(job_id, 5, t0, message=poison_triggers["bug"]), source=f"{job_id}-n05", seq=1)
    bad_value = gz(_node_batch(job_id, 6, t0, message=poison_triggers["data"]), source=f"{job_id}-n06", seq=1)
    _, answers, held = post_in_one_group(client, monkeypatch, first, [good[0], bug, good[1], bad_value, *good[2:]])

    # The group of six failed as a whole, then each batch was stored in its own transaction.
    assert held.sizes == [1, 6, 1, 1, 1, 1, 1, 1]
    assert [a.status_code for a in answers] == [200, 500, 200, 422, 200, 200], [a.text for a in answers]
    assert all(answers[i].json()["status"] == "stored" for i in (0, 2, 4, 5))
    assert answers[1].json()["detail"]["error"] == "internal error"
    assert answers[3].json()["detail"]["error"].startswith("a value is out of range for the database")
    # All or nothing per batch: the refused ones stored none of their rows, nor their batch id.
    nodes = {row[0] for row in db.execute("SELECT DISTINCT node FROM gpu_samples WHERE job_id = %s", (job_id,))}
    assert nodes == {"n00", "n01", "n02", "n03", "n04"}
    assert _count(db, "gpu_samples", job_id) == 5 * 8
    assert db.execute("SELECT sum(samples) FROM gpu_minutes WHERE job_id = %s", (job_id,)).fetchone()[0] == 40
    assert db.execute("SELECT count(*) FROM ingest_batches WHERE source IN (%s, %s)",
                      (f"{job_id}-n05", f"{job_id}-n06")).fetchone()[0] == 0

    # Once the database takes them, the same batches are stored (their ids were never claimed).
    db.execute(f"DROP TRIGGER {poison_triggers['trigger']} ON log_events")
    assert [post(client, body).json()["status"] for body in (bug, bad_value)] == ["stored", "stored"]
    assert _count(db, "gpu_samples", job_id) == 7 * 8


def test_many_nodes_at_once_each_batch_stored_once(
    client: Any, db: psycopg.Connection[Any], job_id: str
) -> None:
    """The default writers, 32 nodes posting three batches each at once, every batch sent twice."""
    t0 = now_us() - 900_000_000
    bodies = [gz(_node_batch(job_id, node, t0 + k * 8_000_000), source=f"{job_id}-n{node:02d}", seq=k)
              for node in range(32) for k in range(3)]
    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(lambda body: post(client, body), bodies + bodies))
    assert {a.status_code for a in answers} == {200}
    statuses = [a.json()["status"] for a in answers]
    assert statuses.count("stored") == 96 and statuses.count("duplicate") == 96
    assert _count(db, "gpu_samples", job_id) == 96 * 8
    assert _count(db, "log_events", job_id) == 96
    assert db.execute("SELECT sum(samples) FROM gpu_minutes WHERE job_id = %s", (job_id,)).fetchone()[0] == 96 * 8
    last = db.execute("SELECT (extract(epoch FROM last_seen) * 1e6)::bigint FROM jobs WHERE job_id = %s",
                      (job_id,)).fetchone()[0]
    # Made by the first group with its latest record; later ones are flushed from memory.
    assert t0 + 7_000_000 <= last <= t0 + 23_000_000


def test_a_lone_batch_does_not_wait_for_a_group(
    database_url: str, data_dir: Path, admin_token: str, job_id: str
) -> None:
    # A first batch waits for others only while others are on their way: alone, it goes at once
    # (the best of three posts, so that a busy machine does not make it look as if it waited).
    with collector(database_url, data_dir, admin_token, group_commit_wait_ms=1000) as client:
        post(client, gz(_node_batch(job_id, 0, now_us())))  # connections and prepared statements
        took = []
        for node in range(1, 4):
            began = time.monotonic()
            assert post(client, gz(_node_batch(job_id, node, now_us()))).json()["status"] == "stored"
            took.append(time.monotonic() - began)
        assert min(took) < 0.9, took


def test_group_commit_settings_are_validated() -> None:
    from jobsight.collector.config.settings import SettingsError, load_collector_settings

    settings = load_collector_settings(group_commit_wait_ms=2, group_commit_writers=1, last_seen_flush_s=1)
    assert (settings.group_commit_wait_ms, settings.group_commit_writers, settings.last_seen_flush_s) == (2, 1, 1)
    for name, value in (("group_commit_wait_ms", -1), ("group_commit_max_batches", 0),
                        ("group_commit_max_records", 0), ("group_commit_writers", 0), ("last_seen_flush_s", 0)):
        with pytest.raises(SettingsError, match=f"JOBSIGHT_{name.upper()}"):
            load_collector_settings(**{name: value})
