"""The shipper against the real collector over a real PostgreSQL: outages, kills, caps, fork."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
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


def _job() -> str:
    return f"test-{uuid4().hex}"


def _settings(collector: Any, spool: Path, job: str, **overrides: Any) -> AgentSettings:
    values: dict[str, Any] = {
        "url": collector.url,
        "token": collector.token,
        "spool_dir": str(spool),
        "job_id": job,
        "node": "testnode",
        "batch_age_s": 0.05,
        "http_timeout_s": 3.0,
    }
    values.update(overrides)
    return AgentSettings(**values)


def _metric(job: str, step: int, name: str = "loss") -> dict[str, Any]:
    return {
        "kind": "metric",
        "job": job,
        "ts": now_us(),
        "node": "testnode",
        "rank": 0,
        "pid": os.getpid(),
        "step": step,
        "name": name,
        "value": float(step),
    }


def _scalar(collector: Any, sql: str, *params: Any) -> Any:
    with psycopg.connect(collector.database_url) as conn:
        row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def _metric_counts(collector: Any, job: str) -> tuple[int, int]:
    """(rows, distinct (name, step)) stored for the job."""
    with psycopg.connect(collector.database_url) as conn:
        row = conn.execute(
            "SELECT count(*), count(DISTINCT (name, step)) FROM metrics WHERE job_id = %s", (job,)
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _dropped(collector: Any, job: str) -> int:
    value = _scalar(
        collector,
        "SELECT coalesce(sum((attrs->>'dropped')::int), 0) FROM log_events"
        " WHERE job_id = %s AND logger = 'jobsight.dropped'",
        job,
    )
    return int(value)


def _settled(shipper: Any, timeout: float = 20.0) -> dict[str, int]:
    """The shipper's counters once they held still for half a second."""
    deadline = time.monotonic() + timeout
    last = shipper.stats()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = shipper.stats()
        if now == last:
            return dict(now)
        last = now
    raise AssertionError(f"the shipper's counters did not settle: {last}")


def _eventually(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


@pytest.fixture
def shippers() -> Any:
    made: list[Shipper] = []

    def make(settings: AgentSettings, **kwargs: Any) -> Shipper:
        kwargs.setdefault("backoff_max_s", 0.5)
        shipper = Shipper(settings, **kwargs)
        made.append(shipper)
        return shipper

    yield make
    for shipper in made:
        shipper.shutdown(1.0)


def test_exports_on_size_on_timer_and_at_shutdown(live_collector: Any, tmp_path: Path, shippers: Any) -> None:
    spool = tmp_path / "spool"
    by_size = _job()
    sized = shippers(_settings(live_collector, spool, by_size, batch_records=10, batch_age_s=3600.0))
    for step in range(10):
        sized.enqueue(_metric(by_size, step))
    _eventually(lambda: _metric_counts(live_collector, by_size)[0] == 10)

    by_timer = _job()
    timed = shippers(_settings(live_collector, spool, by_timer, batch_records=1000, batch_age_s=0.1))
    for step in range(3):
        timed.enqueue(_metric(by_timer, step))
    _eventually(lambda: _metric_counts(live_collector, by_timer)[0] == 3)

    at_exit = _job()
    closing = shippers(_settings(live_collector, spool, at_exit, batch_records=1000, batch_age_s=3600.0))
    for step in range(7):
        closing.enqueue(_metric(at_exit, step))
    closing.shutdown(5.0)
    closing.shutdown(5.0)  # safe twice
    closing.enqueue(_metric(at_exit, 99))  # after shutdown: ignored, never raises
    assert _metric_counts(live_collector, at_exit) == (7, 7)


def test_collector_killed_mid_stream_loses_and_duplicates_nothing(
    live_collector: Any, tmp_path: Path, shippers: Any
) -> None:
    spool = tmp_path / "spool"
    job = _job()
    shipper = shippers(_settings(live_collector, spool, job, batch_records=50))
    total = 3000
    for step in range(total // 2):
        shipper.enqueue(_metric(job, step))
        if step % 100 == 0:
            time.sleep(0.01)
    live_collector.kill()
    for step in range(total // 2, total):
        shipper.enqueue(_metric(job, step))
        if step % 100 == 0:
            time.sleep(0.01)
    _eventually(lambda: shipper.stats()["spooled_batches"] > 0)
    live_collector.start()
    assert shipper.flush(30.0)
    assert _metric_counts(live_collector, job) == (total, total)
    assert shipper.stats()["spool_pending"] == 0


def test_collector_down_at_start_spools_then_replays_in_order(
    live_collector: Any, tmp_path: Path, shippers: Any
) -> None:
    spool = tmp_path / "spool"
    job = _job()
    live_collector.stop()
    shipper = shippers(_settings(live_collector, spool, job, batch_records=20))
    for step in range(200):
        shipper.enqueue(_metric(job, step))
    _eventually(lambda: shipper.stats()["spool_pending"] == 10)
    assert any(p.name.endswith(SUFFIX) for p in spool.iterdir())
    live_collector.start()
    assert shipper.flush(30.0)
    assert _metric_counts(live_collector, job) == (200, 200)
    with psycopg.connect(live_collector.database_url) as conn:
        seqs = [
            row[0]
            for row in conn.execute(
                "SELECT seq FROM ingest_batches WHERE source = %s ORDER BY received_at, seq", (shipper.source,)
            )
        ]
    assert seqs == list(range(10))


def test_spool_of_a_killed_agent_is_replayed_by_the_next(live_collector: Any, tmp_path: Path, shippers: Any) -> None:
    spool = tmp_path / "spool"
    job = _job()
    live_collector.stop()
    code = textwrap.dedent(
        f"""
        import os, signal, time
        from jobsight.agent.settings import AgentSettings
        from jobsight.agent.shipping.shipper import Shipper
        from jobsight.protocol.wire import now_us
        shipper = Shipper(AgentSettings(url={live_collector.url!r}, token={live_collector.token!r},
                                        spool_dir={str(spool)!r}, job_id={job!r}, batch_records=25,
                                        batch_age_s=0.05), backoff_max_s=0.5)
        for step in range(100):
            shipper.enqueue({{"kind": "metric", "job": {job!r}, "ts": now_us(), "step": step,
                              "name": "loss", "value": 1.0}})
        deadline = time.monotonic() + 20
        while shipper.stats()["spool_pending"] < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, check=False, timeout=60)
    assert result.returncode == -signal.SIGKILL
    assert any(p.name.endswith(SUFFIX) for p in spool.iterdir())

    live_collector.start()
    heir = shippers(_settings(live_collector, spool, job))
    heir.start()
    _eventually(lambda: _metric_counts(live_collector, job) == (100, 100))
    _eventually(lambda: not any(p.name.endswith(SUFFIX) for p in spool.iterdir()))


def test_full_queue_never_blocks_and_reports_exactly_what_it_dropped(
    live_collector: Any, tmp_path: Path, shippers: Any
) -> None:
    spool = tmp_path / "spool"
    job = _job()
    shipper = shippers(_settings(live_collector, spool, job, queue_max=20, batch_records=10))
    total = 5000
    for step in range(total):
        shipper.enqueue(_metric(job, step))  # returns at once: the queue is far smaller than the burst
    dropped = shipper.stats()["dropped_records"]
    assert dropped > 0
    assert shipper.flush(30.0)
    stored, distinct = _metric_counts(live_collector, job)
    assert stored == distinct
    _eventually(lambda: _dropped(live_collector, job) == total - stored)
    assert stored + dropped == total


def test_full_spool_while_collector_is_away_reports_exactly_what_it_dropped(
    live_collector: Any, tmp_path: Path, shippers: Any
) -> None:
    spool = tmp_path / "spool"
    job = _job()
    live_collector.stop()
    shipper = shippers(_settings(live_collector, spool, job, batch_records=50, spool_max_bytes=4000))
    total = 1000
    for step in range(total):
        shipper.enqueue(_metric(job, step))
        if step % 50 == 0:
            time.sleep(0.01)
    _eventually(lambda: shipper.stats()["queued"] == 0 and shipper.stats()["dropped_records"] > 0)
    before = _settled(shipper)  # the batch in hand spooled or dropped too
    assert before["spool_pending"] > 0
    live_collector.start()
    _eventually(lambda: _dropped(live_collector, job) + _metric_counts(live_collector, job)[0] == total, 30.0)
    stored, distinct = _metric_counts(live_collector, job)
    assert stored == distinct
    # What reached the spool before the cap was kept: every record not dropped while the collector was
    # away is stored, and none was dropped since. (Counting 50 records a spooled batch flaked: on a busy
    # machine a batch is cut by age with fewer.)
    assert shipper.stats()["dropped_records"] == before["dropped_records"]
    assert stored == total - before["dropped_records"]


def test_forked_child_never_resends_the_parents_records(live_collector: Any, tmp_path: Path, shippers: Any) -> None:
    spool = tmp_path / "spool"
    job = _job()
    shipper = shippers(_settings(live_collector, spool, job, batch_age_s=0.2))
    for step in range(100):
        shipper.enqueue(_metric(job, step, "parent"))
    pid = os.fork()
    if pid == 0:  # the child: leave through os._exit whatever happens, never back into pytest
        code = 1
        try:
            for step in range(50):
                shipper.enqueue(_metric(job, step, "child"))
            code = 0 if shipper.flush(20.0) else 2
            shipper.shutdown(2.0)
        finally:
            os._exit(code)
    for step in range(100, 150):
        shipper.enqueue(_metric(job, step, "parent"))
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert shipper.flush(20.0)
    # A re-sent parent record would come from the child's own source, so it would not be
    # deduplicated: exactly 200 rows means nothing was sent twice.
    assert _metric_counts(live_collector, job) == (200, 200)


def test_rejected_batch_is_set_aside_and_later_batches_go_on(
    live_collector: Any, tmp_path: Path, shippers: Any, caplog: pytest.LogCaptureFixture
) -> None:
    spool = tmp_path / "spool"
    job = _job()
    shipper = shippers(_settings(live_collector, spool, job, batch_age_s=3600.0))
    for step in range(5):
        shipper.enqueue(_metric(job, step))
    assert shipper.flush(10.0)
    bad = {**_metric(job, 5), "bogus_field": 1}  # the collector answers 422: unknown field
    shipper.enqueue(bad)
    assert shipper.flush(10.0)
    shipper.enqueue({**_metric(job, 6), "value": object()})  # not JSON at all: dropped and counted
    for step in range(7, 12):
        shipper.enqueue(_metric(job, step))
    assert shipper.flush(10.0)

    assert _metric_counts(live_collector, job) == (10, 10)
    _eventually(lambda: _dropped(live_collector, job) == 1)
    stats = shipper.stats()
    assert stats["rejected_batches"] == 1
    metas = list((spool / REJECTED_DIR).glob("*.meta.json"))
    assert len(metas) == 1
    assert '"status": 422' in metas[0].read_text()
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1
    assert live_collector.token not in caplog.text


def test_enqueue_from_many_threads_stores_everything_once(live_collector: Any, tmp_path: Path, shippers: Any) -> None:
    spool = tmp_path / "spool"
    job = _job()
    shipper = shippers(_settings(live_collector, spool, job, batch_records=100))

    def produce(name: str) -> None:
        for step in range(500):
            shipper.enqueue(_metric(job, step, name))

    threads = [threading.Thread(target=produce, args=(f"t{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert shipper.flush(20.0)
    assert _metric_counts(live_collector, job) == (2000, 2000)
