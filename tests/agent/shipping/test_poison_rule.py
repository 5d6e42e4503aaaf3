"""The poison rule on its own: which answers count, both bounds, its settings, its meta file.

The clock is a plain list the test moves forward; the answers are the outcomes the real
client builds. The whole path (collector, PostgreSQL, spool, subprocesses) is
``test_poison_batch.py``'s.
"""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import pytest

from jobsight.agent.settings import AgentSettings, load_agent_settings
from jobsight.agent.shipping.outcomes import RETRY, Outcome
from jobsight.agent.shipping.poison import PoisonWatch, records_of
from jobsight.agent.shipping.record_queue import RecordQueue
from jobsight.agent.shipping.spool import REJECTED_DIR, Spool
from jobsight.agent.shipping.spool_format import SpooledBatch
from jobsight.agent.shipping.stats import ShipperStats

BATCH = SpooledBatch("node:1:2", 7, 1, b"")
ERROR_500 = '{"error": "internal error", "request_id": "%s"}'


def _watch(tries: int = 3, after_s: float = 10.0) -> tuple[PoisonWatch, list[float]]:
    now = [1000.0]
    return PoisonWatch(tries, after_s, clock=lambda: now[0]), now


def _answer(status: int, detail: str = "", retry_after: float | None = None) -> Outcome:
    return Outcome(RETRY, status, detail, retry_after)


def test_both_bounds_must_be_reached_and_a_request_id_does_not_make_a_new_answer() -> None:
    watch, now = _watch(tries=3, after_s=10.0)
    for request_id in ("a1", "b2", "c3", "d4"):  # tries enough, time not yet
        assert watch.failed(BATCH, _answer(500, ERROR_500 % request_id)) is None
        now[0] += 1.0
    now[0] += 6.0  # 10 s since the first try
    assert watch.failed(BATCH, _answer(500, ERROR_500 % "e5")) == (
        "quarantined after 5 tries over 10 s: HTTP 500 internal error"
    )

    watch, now = _watch(tries=3, after_s=10.0)
    assert watch.failed(BATCH, _answer(500)) is None
    now[0] += 60.0  # time enough, tries not yet
    assert watch.failed(BATCH, _answer(500)) is None
    assert watch.failed(BATCH, _answer(500)) == "quarantined after 3 tries over 60 s: HTTP 500"


@pytest.mark.parametrize(
    "answer",
    [
        _answer(0, "ConnectionRefusedError: [Errno 111] Connection refused"),
        _answer(502, "Bad Gateway"),
        _answer(503, '{"error": "database unavailable, retry later"}', retry_after=5.0),
        _answer(504, "Gateway Timeout"),
        _answer(408),
        _answer(429),
        _answer(500, ERROR_500 % "x", retry_after=30.0),
    ],
)
def test_transient_answers_never_quarantine(answer: Outcome) -> None:
    watch, now = _watch(tries=2, after_s=1.0)
    for _ in range(50):
        assert watch.failed(BATCH, answer) is None
        now[0] += 100.0


def test_transient_answers_neither_count_nor_break_the_streak() -> None:
    watch, now = _watch(tries=3, after_s=5.0)
    assert watch.failed(BATCH, _answer(500)) is None
    now[0] += 3.0
    assert watch.failed(BATCH, _answer(0)) is None  # the collector went away for a while
    assert watch.failed(BATCH, _answer(503, retry_after=5.0)) is None
    assert watch.failed(BATCH, _answer(500)) is None
    now[0] += 3.0
    assert watch.failed(BATCH, _answer(500)) == "quarantined after 3 tries over 6 s: HTTP 500"


def test_another_status_or_another_batch_starts_over() -> None:
    watch, now = _watch(tries=2, after_s=1.0)
    assert watch.failed(BATCH, _answer(500)) is None
    now[0] += 5.0
    assert watch.failed(BATCH, _answer(507)) is None  # a different answer: not the same failure
    now[0] += 5.0
    assert watch.failed(BATCH, _answer(507)) == "quarantined after 2 tries over 5 s: HTTP 507"

    other = SpooledBatch("node:1:2", 8, 1, b"")
    assert watch.failed(BATCH, _answer(500)) is None
    now[0] += 5.0
    assert watch.failed(other, _answer(500)) is None
    watch.forget()  # the head was acknowledged
    now[0] += 5.0
    assert watch.failed(other, _answer(500)) is None


def test_settings_from_env_and_toml_and_bad_values_default(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    defaults = AgentSettings()
    assert (defaults.poison_tries, defaults.poison_after_s) == (5, 120.0)
    config = tmp_path / "agent.toml"
    config.write_text("[agent]\npoison_tries = 8\npoison_after_s = 600\n")
    from_file = load_agent_settings({"JOBSIGHT_CONFIG": str(config)})
    assert (from_file.poison_tries, from_file.poison_after_s) == (8, 600.0)
    from_env = load_agent_settings(
        {"JOBSIGHT_CONFIG": str(config), "JOBSIGHT_POISON_TRIES": "2", "JOBSIGHT_POISON_AFTER_S": "30.5"}
    )
    assert (from_env.poison_tries, from_env.poison_after_s) == (2, 30.5)
    for tries, after in (("0", "-1"), ("many", "soon"), ("-3", "nan")):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            bad = load_agent_settings({"JOBSIGHT_POISON_TRIES": tries, "JOBSIGHT_POISON_AFTER_S": after})
        assert (bad.poison_tries, bad.poison_after_s) == (5, 120.0)
        assert "JOBSIGHT_POISON_TRIES" in caplog.text and "JOBSIGHT_POISON_AFTER_S" in caplog.text


def test_quarantined_batch_is_kept_in_rejected_with_why(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path), 1 << 20)
    spool.append("s", 0, 1, b"body-0")
    spool.append("s", 1, 1, b"body-1")
    head = spool.peek()
    assert head is not None
    why = "quarantined after 5 tries over 130 s: HTTP 500 internal error"
    spool.reject(head, 500, ERROR_500 % "x", quarantined=why)
    assert [b.seq for b in iter(lambda: _ack(spool), None)] == [1]
    (meta,) = (tmp_path / REJECTED_DIR).glob("*.meta.json")
    assert json.loads(meta.read_text()) == {
        "source": "s", "seq": 0, "records": 1, "status": 500, "detail": ERROR_500 % "x", "quarantined": why,
    }
    spool.close()


def _ack(spool: Spool) -> SpooledBatch | None:
    batch = spool.peek()
    if batch is not None:
        spool.ack()
    return batch


def test_quarantined_records_are_reported_by_job_and_unreadable_ones_still_counted() -> None:
    records = [
        {"kind": "log", "job": "42", "ts": 1, "level": "INFO", "message": "poison"},
        {"kind": "metric", "job": "42", "ts": 1, "name": "loss", "value": 1.0},
        {"kind": "metric", "job": "99", "ts": 1, "name": "loss", "value": 1.0},
        {"kind": "dropped", "job": "42", "ts": 1, "count": 7, "reason": "queue full"},
    ]
    body = gzip.compress(json.dumps({"v": 1, "source": "s", "seq": 0, "records": records}).encode())
    assert records_of(SpooledBatch("s", 0, 4, body)) == records
    assert records_of(SpooledBatch("s", 0, 3, b"not gzip")) == [{}, {}, {}]

    stats = ShipperStats()
    queue = RecordQueue(AgentSettings(job_id="42", batch_records=100), stats)
    queue.drop_set_aside(records, "quarantined after 5 tries over 130 s: HTTP 500 internal error")
    reported = queue.take_batch(force=True)
    assert reported is not None
    counts = {(r["job"], r["reason"]): r["count"] for r in reported}
    assert counts == {
        ("42", "quarantined after 5 tries over 130 s: HTTP 500 internal error"): 2,
        # Another job's record is reported under this process's job (its token writes no other).
        ("42", "quarantined after 5 tries over 130 s: HTTP 500 internal error (records of job 99)"): 1,
        # An unsent drop report rolls forward with its own reason.
        ("42", "queue full"): 7,
    }
    assert stats.dropped_records == 3  # the 7 were counted when they were dropped
    assert queue.expected == 3 and queue.settled == 0  # the reports are promised; the batch is the caller's
