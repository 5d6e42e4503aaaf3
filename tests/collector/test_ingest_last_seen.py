"""A job's row is not written by every batch: the first batch of a job creates it, and later
``last_seen`` times are kept in memory and written every ``last_seen_flush_s``; the rollup
merges batches without changing any batch's own sums."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from jobsight.protocol.wire import now_us
from tests.collector.helpers import gz, post

S = 1_000_000


@contextmanager
def collector(database_url: str, data_dir: Path, admin_token: str, **settings: Any) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from jobsight.collector.app import create_app
    from jobsight.collector.config.settings import load_collector_settings

    with TestClient(create_app(load_collector_settings(database_url=database_url, data_dir=data_dir,
                                                       **settings))) as client:
        client.headers["Authorization"] = f"Bearer {admin_token}"
        yield client


def _metric(job: str, ts: int) -> dict[str, Any]:
    return {"kind": "metric", "job": job, "ts": ts, "name": "loss", "value": 1.0}


def _last_seen(db: psycopg.Connection[Any], job: str) -> int:
    row = db.execute("SELECT (extract(epoch FROM last_seen) * 1e6)::bigint FROM jobs WHERE job_id = %s",
                     (job,)).fetchone()
    return int(row[0])


def test_last_seen_is_kept_in_memory_and_written_when_the_collector_stops(
    database_url: str, data_dir: Path, admin_token: str, db: psycopg.Connection[Any], job_id: str
) -> None:
    t0 = now_us() - 600 * S
    with collector(database_url, data_dir, admin_token, last_seen_flush_s=3600) as client:
        # The first batch creates the row, with its last record time.
        assert post(client, gz([_metric(job_id, t0), _metric(job_id, t0 + S)])).status_code == 200
        assert _last_seen(db, job_id) == t0 + S
        # Later batches do not write the row...
        for ts in (t0 + 3 * S, t0 + 11 * S, t0 + 2 * S):
            assert post(client, gz([_metric(job_id, ts)])).status_code == 200
        assert _last_seen(db, job_id) == t0 + S
    # ...until the flush: here, the collector stopping. An older record did not move it back.
    assert _last_seen(db, job_id) == t0 + 11 * S


def test_kept_last_seen_is_flushed_while_running(
    database_url: str, data_dir: Path, admin_token: str, db: psycopg.Connection[Any], job_id: str
) -> None:
    t0 = now_us() - 600 * S
    with collector(database_url, data_dir, admin_token, last_seen_flush_s=0.3) as client:
        assert post(client, gz([_metric(job_id, t0)])).status_code == 200
        assert post(client, gz([_metric(job_id, t0 + S // 10)])).status_code == 200
        deadline = time.monotonic() + 10
        while _last_seen(db, job_id) != t0 + S // 10:
            assert time.monotonic() < deadline, "last_seen was never flushed"
            time.sleep(0.05)


def test_a_job_row_removed_behind_the_collectors_back_comes_back_with_its_prolog(
    client: Any, db: psycopg.Connection[Any], job_id: str
) -> None:
    t0 = now_us() - 600 * S
    assert post(client, gz([_metric(job_id, t0)])).status_code == 200
    db.execute("DELETE FROM jobs WHERE job_id = %s", (job_id,))
    # The collector remembers having written the row, but job_started and job_ended always write it.
    started = {"kind": "job_started", "job": job_id, "ts": t0 + S, "node": "n1", "user": "alice"}
    assert post(client, gz([started, _metric(job_id, t0 + 2 * S)])).status_code == 200
    assert db.execute("SELECT user_name FROM jobs WHERE job_id = %s", (job_id,)).fetchone() == ("alice",)


def test_jobs_seen_decides_which_rows_to_write() -> None:
    from jobsight.collector.jobs.jobs_seen import JobsSeen

    seen = JobsSeen()
    key, other = ("c", "j1"), ("c", "j2")
    assert seen.due({key: (100 * S, 101 * S)}, set()) == {key: (100 * S, 101 * S)}  # never written
    seen.committed({key: (100 * S, 101 * S)}, {key: (100 * S, 101 * S)})
    assert seen.due({key: (102 * S, 900 * S)}, set()) == {}  # later records: kept for the flush
    assert seen.due({key: (102 * S, 104 * S)}, {key}) == {key: (102 * S, 104 * S)}  # job_started/ended
    assert seen.due({key: (99 * S, 100 * S)}, set()) == {key: (99 * S, 101 * S)}  # an earlier start
    # A group that was not committed changes nothing; a committed one leaves its time pending.
    assert seen.unflushed() == {}
    seen.committed({key: (102 * S, 104 * S), other: (1 * S, 2 * S)}, {other: (1 * S, 2 * S)})
    assert seen.unflushed() == {key: 104 * S}
    # A write the group must make carries the pending time too.
    assert seen.due({key: (103 * S, 103 * S)}, {key}) == {key: (103 * S, 104 * S)}
    seen.flushed({key: 104 * S})
    assert seen.unflushed() == {}


def test_merged_rollups_add_up_without_changing_either_batch() -> None:
    from jobsight.collector.store.schema import gpu_samples
    from jobsight.collector.tiers.rollup import MinuteRollup, merged

    names = [column.name for column in gpu_samples.columns]

    def row(ts: int, util: float, energy: float) -> tuple[Any, ...]:
        values = {"cluster": "c", "job_id": "j", "node": "n1", "gpu_index": 0, "gpu_uuid": "GPU-0",
                  "util_gpu": util, "energy_j": energy, "power_w": 100.0}
        return tuple(values.get(name) for name in names)

    base = 1_763_769_600 * S  # a whole minute
    a, b = MinuteRollup(), MinuteRollup()
    a.add_rows([row(base + S, 10.0, 5.0), row(base + 2 * S, 2.0, 7.0)], [base + S, base + 2 * S])
    b.add_rows([row(base + 3 * S, 90.0, 9.0)], [base + 3 * S])
    b.add_rows([row(base + 61 * S, 50.0, 11.0)], [base + 61 * S])  # the next minute
    before = {k: (v.samples, v.util_gpu_sum) for k, v in a.sums.items()}
    rows = merged([("c", a), ("c", b), ("other", b)])
    assert len(rows) == 4
    minute = rows[("c", "j", "n1", 0, "", base)]
    assert (minute.samples, minute.util_gpu_sum, minute.util_gpu_n, minute.util_gpu_max, minute.util_idle_n) == (
        3, 102.0, 3, 90.0, 1)
    assert (minute.energy_min, minute.energy_max, minute.first_ts, minute.last_ts) == (
        5.0, 9.0, base + S, base + 3 * S)
    assert rows[("other", "j", "n1", 0, "", base)].samples == 1
    assert {k: (v.samples, v.util_gpu_sum) for k, v in a.sums.items()} == before
