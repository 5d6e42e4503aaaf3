"""Fault test: a batch the collector answers with a deterministic 500 does not hold the spool.

All real: the collector is a uvicorn subprocess over the embedded PostgreSQL, and the 500
comes from PostgreSQL itself, through a row trigger on ``log_events`` that refuses one
message, so the collector's own error handling answers it (HTTP 500 with a fresh request
id each time). The shippers are real, one in this process and two in subprocesses sharing
its spool directory: one dies with the poison batch at the head of its spool, the next
adopts it.
"""

from __future__ import annotations

import gzip
import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.shipper import Shipper
from jobsight.agent.shipping.spool import REJECTED_DIR, SUFFIX
from jobsight.protocol.wire import now_us

REPO = Path(__file__).parents[3]
POISON = "poison"
CLEAN = 10_000
OTHERS = 1_000
"""Clean records of each of the two later processes."""
# Shortened from the defaults (5 tries, 120 s) so the test takes seconds.
TRIES = 3
AFTER_S = 1.0


@pytest.fixture
def job() -> str:
    return f"test-{uuid4().hex}"


@pytest.fixture
def poison_trigger(database_url: str, job: str) -> Iterator[None]:
    """Make PostgreSQL refuse, every time, a log line ``poison`` of this test's job.

    A BEFORE ROW trigger on the partitioned parent is cloned onto every partition (now and
    later, PostgreSQL >= 13) and fires for the rows of the collector's COPY. The exception
    (SQLSTATE P0001, ``raise_exception``) is neither a connection error (503) nor a data
    error (the request's fault: 422), so the collector answers 500, as for a bug that one
    record trips.
    """
    name = f"jobsight_test_poison_{uuid4().hex[:12]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$"
            f" BEGIN RAISE EXCEPTION 'poison record of job %', NEW.job_id; END $$"
        )
        conn.execute(
            f"CREATE TRIGGER {name} BEFORE INSERT ON log_events FOR EACH ROW"
            f" WHEN (NEW.message = '{POISON}' AND NEW.job_id = '{job}') EXECUTE FUNCTION {name}()"
        )
    try:
        yield
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"DROP TRIGGER IF EXISTS {name} ON log_events")
            conn.execute(f"DROP FUNCTION IF EXISTS {name}()")


def _settings(collector: Any, spool: Path, job: str, **overrides: Any) -> AgentSettings:
    values: dict[str, Any] = {
        "url": collector.url,
        "token": collector.token,
        "spool_dir": str(spool),
        "job_id": job,
        "node": "testnode",
        "batch_records": 500,
        "batch_age_s": 0.05,
        "http_timeout_s": 5.0,
        "poison_tries": TRIES,
        "poison_after_s": AFTER_S,
    }
    values.update(overrides)
    return AgentSettings(**values)


def _log(job: str, message: str) -> dict[str, Any]:
    return {"kind": "log", "job": job, "ts": now_us(), "node": "testnode", "level": "INFO",
            "logger": "test.poison", "message": message}


def _rows(collector: Any, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(collector.database_url) as conn:
        return list(conn.execute(sql, params).fetchall())


def _stored(collector: Any, job: str, prefix: str) -> tuple[int, int]:
    """(rows, distinct messages) of this test's log lines starting with ``prefix``."""
    ((rows, distinct),) = _rows(
        collector,
        "SELECT count(*), count(DISTINCT message) FROM log_events"
        " WHERE job_id = %s AND logger = 'test.poison' AND message LIKE %s",
        job,
        prefix + "%",
    )
    return int(rows), int(distinct)


def _quarantine_reports(collector: Any, job: str) -> list[tuple[int, str]]:
    """(count, reason) of every ``dropped`` record the collector stored for a quarantine."""
    rows = _rows(
        collector,
        "SELECT (attrs->>'dropped')::int, attrs->>'reason' FROM log_events"
        " WHERE job_id = %s AND logger = 'jobsight.dropped' ORDER BY ts",
        job,
    )
    return [(int(count), str(reason)) for count, reason in rows]


def _check_reason(reason: str) -> None:
    """Both bounds were reached, and the answer is named without its request id."""
    match = re.fullmatch(r"quarantined after (\d+) tries over (\d+) s: HTTP 500 internal error", reason)
    assert match is not None, reason
    assert int(match[1]) >= TRIES and int(match[2]) >= AFTER_S


def _quarantined(spool: Path) -> dict[str, dict[str, Any]]:
    """The meta files in ``rejected/``, by batch source."""
    metas = [json.loads(p.read_text()) for p in (spool / REJECTED_DIR).glob("*.meta.json")]
    return {meta["source"]: meta for meta in metas}


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True, timeout=60,
        check=False,
    )


def _wait(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_a_batch_answered_500_every_time_is_quarantined_and_the_rest_flows(
    live_collector: Any, poison_trigger: None, job: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    spool = tmp_path / "spool"

    # -- this process: the poison batch, then 10,000 clean records queued behind it --------
    shipper = Shipper(_settings(live_collector, spool, job), backoff_max_s=0.5)
    try:
        shipper.enqueue(_log(job, POISON))
        # Its first try has failed and it heads the spool: whatever comes now waits behind it.
        _wait(lambda: shipper.stats()["spool_pending"] == 1)
        for i in range(CLEAN):
            shipper.enqueue(_log(job, f"clean {i}"))
        assert shipper.flush(30.0)  # the poison batch is settled too: set aside, not pending
        assert shipper.flush(10.0)  # and the dropped record that reports it is delivered
        stats = shipper.stats()
    finally:
        shipper.shutdown(5.0)

    assert _stored(live_collector, job, "clean ") == (CLEAN, CLEAN)
    assert _stored(live_collector, job, POISON) == (0, 0)
    assert stats["quarantined_batches"] == 1 and stats["rejected_batches"] == 0
    assert stats["spool_pending"] == 0

    meta = _quarantined(spool)[shipper.source]
    assert (meta["seq"], meta["records"], meta["status"]) == (0, 1, 500)
    assert "internal error" in meta["detail"]
    _check_reason(meta["quarantined"])
    (body,) = (spool / REJECTED_DIR).glob(f"*-{meta['seq']}.json.gz")
    kept = json.loads(gzip.decompress(body.read_bytes()))
    assert [r["message"] for r in kept["records"]] == [POISON]
    # The collector turns a dropped record into a WARNING line of logger jobsight.dropped.
    assert _quarantine_reports(live_collector, job) == [(1, meta["quarantined"])]
    # Order held: every batch after the poison one was stored, each once.
    seqs = [row[0] for row in _rows(live_collector, "SELECT seq FROM ingest_batches WHERE source = %s ORDER BY seq",
                                    shipper.source)]
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= CLEAN // 500

    # -- a later process dies with another poison batch at the head of its spool ----------
    common = f"""
        import json, os, signal, time
        from jobsight.agent.settings import AgentSettings
        from jobsight.agent.shipping.shipper import Shipper
        from jobsight.protocol.wire import now_us

        def settings(**kw):
            return AgentSettings(url={live_collector.url!r}, token={live_collector.token!r}, spool_dir={str(spool)!r},
                                 job_id={job!r}, node="testnode", batch_records=250, batch_age_s=0.05, **kw)

        def log(message):
            return {{"kind": "log", "job": {job!r}, "ts": now_us(), "node": "testnode", "level": "INFO",
                     "logger": "test.poison", "message": message}}
    """
    dead = _run(
        common
        + f"""
        shipper = Shipper(settings(), backoff_max_s=0.5)  # default poison rule: 120 s, it dies well before
        shipper.enqueue(log({POISON!r}))
        deadline = time.monotonic() + 20
        while shipper.stats()["spool_pending"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        for i in range({OTHERS}):
            shipper.enqueue(log(f"dead {{i}}"))
        shipper.shutdown(3.0)  # the collector "is away" (backing off): everything goes to the spool
        print(json.dumps({{"source": shipper.source}}), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    assert dead.returncode == -signal.SIGKILL, dead.stderr
    dead_source = json.loads(dead.stdout)["source"]
    assert any(p.name.endswith(SUFFIX) for p in spool.iterdir())
    assert _stored(live_collector, job, "dead ") == (0, 0)  # all of it waits behind its poison batch

    # -- the next process adopts that spool and delivers everything it has ----------------
    heir = _run(
        common
        + f"""
        shipper = Shipper(settings(poison_tries={TRIES}, poison_after_s={AFTER_S}), backoff_max_s=0.5)
        shipper.start()  # adopts the dead process's segment: its batches go first, in order
        for i in range({OTHERS}):
            shipper.enqueue(log(f"heir {{i}}"))
        mine = shipper.flush(30.0)
        report = shipper.flush(10.0)
        stats = shipper.stats()
        shipper.shutdown(5.0)
        print(json.dumps({{"mine": mine, "report": report, "stats": stats, "source": shipper.source}}), flush=True)
        """
    )
    assert heir.returncode == 0, heir.stderr
    result = json.loads(heir.stdout)
    assert result["mine"] and result["report"]
    assert result["stats"]["quarantined_batches"] == 1

    assert _stored(live_collector, job, "dead ") == (OTHERS, OTHERS)
    assert _stored(live_collector, job, "heir ") == (OTHERS, OTHERS)
    assert _stored(live_collector, job, POISON) == (0, 0)
    adopted = _quarantined(spool)[dead_source]
    assert (adopted["seq"], adopted["records"], adopted["status"]) == (0, 1, 500)
    _check_reason(adopted["quarantined"])
    reports = _quarantine_reports(live_collector, job)
    assert reports == [(1, meta["quarantined"]), (1, adopted["quarantined"])]
    assert set(_quarantined(spool)) == {shipper.source, dead_source}
    assert not any(p.name.endswith(SUFFIX) for p in spool.iterdir())  # nothing left waiting
    assert time.monotonic() - started < 60
