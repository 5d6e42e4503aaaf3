"""The per-rank minute rollup of training steps (``step_minutes``) and the epoch starts
(``epoch_starts``), written by the ingest path and read by ``queries.step_series`` and
``queries.epoch_starts``: the same answers as the steps themselves, however the steps were
split into batches and groups and in whatever order they arrived."""

from __future__ import annotations

import datetime as dt
import math
import random
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from jobsight.collector.query import series as queries
from jobsight.collector.store import migrate
from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.store.timestamps import MINUTE_US, ts_from_us
from jobsight.collector.tiers import step_rollup
from jobsight.protocol.wire import now_us
from tests.collector.helpers import gz, post

S = 1_000_000
CLUSTER = "default"  # what helpers.gz's envelopes name
MINUTES = 5


@contextmanager
def collector(database_url: str, data_dir: Path, admin_token: str, **settings: Any) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from jobsight.collector.app import create_app
    from jobsight.collector.config.settings import load_collector_settings

    app = create_app(load_collector_settings(database_url=database_url, data_dir=data_dir, **settings))
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {admin_token}"
        yield client


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as c:
        yield c


def _minute_ago(minutes: int) -> int:
    """A whole UTC minute ``minutes`` ago, in µs."""
    us = now_us() - minutes * MINUTE_US
    return us - us % MINUTE_US


def _step(job: str, ts: int, step: int, rank: int | None, **fields: Any) -> dict[str, Any]:
    record = {"kind": "step", "job": job, "ts": ts, "node": "n1", "step": step, "duration_s": 0.5, **fields}
    if rank is not None:
        record["rank"] = rank
    return record


def _run(job: str, t0: int, seed: int = 7) -> list[dict[str, Any]]:
    """:data:`MINUTES` minutes of steps from ``t0`` on ranks 0-3 and on a process with no rank, at
    irregular times: mostly training (``phase`` 'train' or none) with validation steps between,
    optional fields missing at times, and epochs of 40 steps that start at odd moments of a
    minute. A validation step of epoch 1 comes before any of its training steps."""
    rng = random.Random(seed)
    records = [_step(job, t0 + S, 0, 0, phase="val", epoch=1, duration_s=9.0)]
    for rank in (0, 1, 2, 3, None):
        ts, step = t0 + rng.randrange(2 * S), 0
        while ts < t0 + MINUTES * MINUTE_US:
            fields: dict[str, Any] = {
                "phase": rng.choice(["train"] * 5 + [None, "val", "predict"]),
                "epoch": step // 40,
                "duration_s": round(rng.uniform(0.05, 2.5), 6),
            }
            if rng.random() < 0.8:
                fields["data_wait_s"] = rng.uniform(0.0, 0.4)
            if rng.random() < 0.7:
                fields["samples"] = rng.choice((16, 32, 64))
            records.append(_step(job, ts, step, rank, **fields))
            ts += rng.randrange(S // 2, 3 * S)
            step += 1
    return records


def _chunks(records: list[dict[str, Any]], rng: random.Random, most: int) -> list[list[dict[str, Any]]]:
    out, at = [], 0
    while at < len(records):
        size = rng.randint(1, most)
        out.append(records[at:at + size])
        at += size
    return out


def _post_all(client: Any, bodies: list[bytes], threads: int = 1) -> None:
    if threads == 1:
        answers = [post(client, body) for body in bodies]
    else:
        with ThreadPoolExecutor(threads) as pool:
            answers = list(pool.map(lambda body: post(client, body), bodies))
    assert [a.status_code for a in answers] == [200] * len(bodies), [a.text for a in answers if a.status_code != 200]


def _same(rows: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    """Equal rows, floats up to summation order."""
    assert len(rows) == len(expected)
    for row, want in zip(rows, expected, strict=True):
        assert list(row) == list(want)
        for name, value in want.items():
            if isinstance(value, float):
                assert isinstance(row[name], float) and math.isclose(row[name], value, rel_tol=1e-12), (name, row)
            else:
                assert row[name] == value and type(row[name]) is type(value), (name, row, want)


def _aligned(t0: int, points: int, minutes: int) -> tuple[dt.datetime, dt.datetime]:
    """A window from ``t0`` whose ``points`` buckets are exactly ``minutes`` wide:
    ``TimeRange.bucket_seconds`` gives ``span // points + 1`` µs."""
    return ts_from_us(t0), ts_from_us(t0 + points * (minutes * MINUTE_US - 1))


def _raw(conn: psycopg.Connection[Any], statements: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The steps' own statement, run with the rollup statement's buckets."""
    assert [query for query, _ in statements] == [queries.STEPS_FROM_MINUTES, queries.STEPS_FROM_ROWS]
    return conn.execute(queries.STEPS_FROM_ROWS, statements[0][1]).fetchall()


def _raw_epochs(conn: psycopg.Connection[Any], job: str) -> list[dict[str, Any]]:
    return conn.execute(
        """SELECT epoch, min(ts) AS ts FROM steps WHERE job_id = %s AND cluster = %s AND epoch IS NOT NULL
               AND coalesce(phase, 'train') = 'train' GROUP BY epoch ORDER BY epoch""",
        (job, CLUSTER),
    ).fetchall()


def _minutes(conn: psycopg.Connection[Any], job: str) -> list[dict[str, Any]]:
    return conn.execute(
        """SELECT rank, ts, steps, duration_sum, duration_max, data_wait_sum, samples_sum, last_step, epoch,
                  first_ts, last_ts FROM step_minutes WHERE job_id = %s AND cluster = %s ORDER BY rank, ts""",
        (job, CLUSTER),
    ).fetchall()


def test_minute_buckets_equal_the_steps_however_the_batches_were_split(
    database_url: str, data_dir: Path, admin_token: str, conn: psycopg.Connection[Any], job_id: str
) -> None:
    t0 = _minute_ago(20)
    rng = random.Random(1)
    jobs = {split: f"{job_id}-{split}" for split in ("one", "small", "concurrent")}
    records = {split: _run(job, t0) for split, job in jobs.items()}
    shuffled = {split: rng.sample(rs, len(rs)) for split, rs in records.items()}
    with collector(database_url, data_dir, admin_token, group_commit_writers=2) as client:
        _post_all(client, [gz(records["one"])])
        _post_all(client, [gz(chunk) for chunk in _chunks(shuffled["small"], rng, 12)])
        _post_all(client, [gz(chunk) for chunk in _chunks(shuffled["concurrent"], rng, 60)], threads=8)

    stored = {split: _minutes(conn, job) for split, job in jobs.items()}
    for split in ("small", "concurrent"):
        _same(stored[split], stored["one"])
    train = [r for r in records["one"] if r.get("phase") in (None, "train")]
    assert sum(r["steps"] for r in stored["one"]) == len(train)
    assert {r["rank"] for r in stored["one"]} == {step_rollup.NO_RANK, 0, 1, 2, 3}

    for job in jobs.values():
        for points, minutes in ((MINUTES, 1), (3, 2), (1, MINUTES)):
            start, end = _aligned(t0, points, minutes)
            statements = queries.step_series_statements(conn, CLUSTER, job, start=start, end=end, points=points)
            assert statements[0][1]["width"] == minutes * 60
            rows = queries.step_series(conn, CLUSTER, job, start=start, end=end, points=points)
            assert rows == conn.execute(*statements[0]).fetchall()
            _same(rows, _raw(conn, statements))
            assert {r["rank"] for r in rows} == {None, 0, 1, 2, 3}
            assert sum(r["steps"] for r in rows) == len(train)
        assert queries.epoch_starts(conn, CLUSTER, job) == _raw_epochs(conn, job)


def test_the_whole_run_at_any_width_counts_every_training_step_once(
    client: Any, conn: psycopg.Connection[Any], job_id: str
) -> None:
    """Buckets that do not fall on whole minutes (a width of 120.000001 s, from the run's own
    start) still hold every step exactly once, each minute in the bucket of its middle."""
    t0 = _minute_ago(20) + 17 * S + 345
    records = _run(job_id, t0, seed=3)
    _post_all(client, [gz(records)])
    train = [r for r in records if r.get("phase") in (None, "train")]
    for points in (2, 3, MINUTES):
        statements = queries.step_series_statements(conn, CLUSTER, job_id, points=points)
        assert statements[0][0] == queries.STEPS_FROM_MINUTES
        rows = queries.step_series(conn, CLUSTER, job_id, points=points)
        assert len({r["bucket"] for r in rows}) <= points
        assert sum(r["steps"] for r in rows) == len(train)
        assert sum(r["samples"] for r in rows) == sum(r.get("samples") or 0 for r in train)
        assert {r["rank"]: r["last_step"] for r in rows if r["bucket"] == max(x["bucket"] for x in rows)} == {
            rank: max(r["step"] for r in train if r.get("rank") == rank) for rank in (None, 0, 1, 2, 3)}
    # Narrow buckets read the steps.
    assert [q for q, _ in queries.step_series_statements(conn, CLUSTER, job_id, points=1000)] == [
        queries.STEPS_FROM_ROWS]


def test_a_minute_without_data_waits_or_samples_has_none(
    client: Any, conn: psycopg.Connection[Any], job_id: str
) -> None:
    t0 = _minute_ago(20)
    records = [_step(job_id, t0 + 5 * S + i * S, i, None, duration_s=1) for i in range(3)]
    records.append(_step(job_id, t0 + MINUTE_US + 5 * S, 3, None, duration_s=0.25, data_wait_s=0.05, samples=8))
    _post_all(client, [gz(records)])
    start, end = _aligned(t0, 2, 1)
    rows = queries.step_series(conn, CLUSTER, job_id, start=start, end=end, points=2)
    _same(rows, _raw(conn, queries.step_series_statements(conn, CLUSTER, job_id, start=start, end=end, points=2)))
    assert [(r["rank"], r["steps"], r["samples"], r["data_wait_share"], r["duration_s"]) for r in rows] == [
        (None, 3, None, None, 1.0), (None, 1, 8, 0.2, 0.25)]
    assert [r["rank"] for r in _minutes(conn, job_id)] == [step_rollup.NO_RANK] * 2


def test_phases_other_than_training_are_left_out(client: Any, conn: psycopg.Connection[Any], job_id: str) -> None:
    t0 = _minute_ago(20)
    _post_all(client, [gz([_step(job_id, t0 + S, 0, 0, phase="val", epoch=0),
                           _step(job_id, t0 + 2 * S, 1, 0, phase="test", epoch=1)])])
    assert _minutes(conn, job_id) == []
    assert queries.epoch_starts(conn, CLUSTER, job_id) == []
    # The steps are there (the job's window), but no training step among them.
    assert queries.step_series(conn, CLUSTER, job_id, points=1) == []


def test_epoch_starts_are_exact_and_a_later_batch_can_move_one_earlier(
    client: Any, conn: psycopg.Connection[Any], job_id: str
) -> None:
    t0 = _minute_ago(20)

    def starts() -> dict[int, dt.datetime]:
        return {r["epoch"]: r["ts"] for r in queries.epoch_starts(conn, CLUSTER, job_id)}

    # Epoch 1 starts in the middle of a minute, to the microsecond.
    _post_all(client, [gz([_step(job_id, t0 + 10 * S, 0, 0, epoch=0),
                           _step(job_id, t0 + 97 * S + 123_457, 1, 0, epoch=1),
                           _step(job_id, t0 + 99 * S, 2, 0, epoch=1)])])
    assert starts() == {0: ts_from_us(t0 + 10 * S), 1: ts_from_us(t0 + 97 * S + 123_457)}
    # Rank 1 was behind: its batch arrives later with earlier steps of both epochs.
    _post_all(client, [gz([_step(job_id, t0 + 9 * S, 0, 1, epoch=0),
                           _step(job_id, t0 + 96 * S + 5, 1, 1, epoch=1)])])
    assert starts() == {0: ts_from_us(t0 + 9 * S), 1: ts_from_us(t0 + 96 * S + 5)}
    # Later steps, validation steps and steps of another job change nothing.
    _post_all(client, [gz([_step(job_id, t0 + 9 * S + 1, 0, 2, epoch=0),
                           _step(job_id, t0 + 5 * S, 0, 2, epoch=1, phase="val"),
                           _step(f"{job_id}-other", t0 + S, 0, 0, epoch=1)])])
    assert starts() == {0: ts_from_us(t0 + 9 * S), 1: ts_from_us(t0 + 96 * S + 5)}
    assert queries.epoch_starts(conn, CLUSTER, job_id) == _raw_epochs(conn, job_id)


def test_epoch_starts_are_exact_when_batches_race(
    database_url: str, data_dir: Path, admin_token: str, conn: psycopg.Connection[Any], job_id: str
) -> None:
    """Many ranks' batches at once, in no order: every epoch's start is its earliest step."""
    t0 = _minute_ago(20)
    rng = random.Random(5)
    records = [_step(job_id, t0 + rng.randrange(4 * MINUTE_US), step, rank, epoch=rng.randrange(4))
               for rank in range(16) for step in range(12)]
    bodies = [gz(chunk) for chunk in _chunks(rng.sample(records, len(records)), rng, 5)]
    with collector(database_url, data_dir, admin_token, group_commit_writers=2) as client:
        _post_all(client, bodies, threads=8)
    assert queries.epoch_starts(conn, CLUSTER, job_id) == _raw_epochs(conn, job_id)
    assert len(queries.epoch_starts(conn, CLUSTER, job_id)) == 4


def test_epochs_seen_decides_which_starts_to_write() -> None:
    seen = step_rollup.EpochsSeen(limit=4)
    a, b = ("c", "j", 0), ("c", "j", 1)
    assert seen.due({a: 100, b: 200}) == {a: 100, b: 200}  # never written
    seen.committed({a: 100})  # b's group rolled back: nothing noted for it
    assert seen.due({a: 100, b: 200}) == {b: 200}
    assert seen.due({a: 99}) == {a: 99}  # an earlier start
    seen.committed({a: 99, b: 200})
    assert seen.due({a: 100, b: 250}) == {}
    # Bounded: past the limit the oldest are forgotten, so they are written again.
    seen.committed({("c", "k", e): 1 for e in range(4)})
    assert seen.due({a: 99, ("c", "k", 3): 1}) == {a: 99}


def test_merged_rollups_add_up_without_changing_either_batch() -> None:
    from jobsight.collector.store.schema import steps

    names = [column.name for column in steps.columns]

    def row(ts: int, step: int, duration: float, wait: float | None) -> tuple[Any, ...]:
        values = {"cluster": "c", "job_id": "j", "rank": 3, "step": step, "epoch": 2, "duration_s": duration,
                  "data_wait_s": wait}
        return tuple(values.get(name) for name in names)

    base = 1_763_769_600 * S
    a, b = step_rollup.StepRollup(), step_rollup.StepRollup()
    a.add_rows([row(base + 2 * S, 5, 0.5, None)], [base + 2 * S])
    b.add_rows([row(base + S, 4, 0.75, 0.25), row(base + 61 * S, 6, 0.25, None)], [base + S, base + 61 * S])
    merged = step_rollup.merged([("c", a), ("c", b)])
    minute = merged[("c", "j", 3, base)]
    assert (minute.steps, minute.duration_sum, minute.duration_max, minute.data_wait_sum, minute.last_step,
            minute.first_ts, minute.last_ts) == (2, 1.25, 0.75, 0.25, 5, base + S, base + 2 * S)
    assert merged[("c", "j", 3, base + MINUTE_US)].steps == 1
    assert a.sums[("j", 3, base)].steps == 1 and a.sums[("j", 3, base)].data_wait_sum is None
    assert step_rollup.merged_epochs([("c", a), ("c", b)]) == {("c", "j", 2): base + S}


def test_rebuild_gives_what_ingest_wrote(client: Any, conn: psycopg.Connection[Any], job_id: str) -> None:
    """The seeds' rebuild from the steps matches the ingest path's rows."""
    _post_all(client, [gz(_run(job_id, _minute_ago(20), seed=11))])
    ingested, epochs = _minutes(conn, job_id), queries.epoch_starts(conn, CLUSTER, job_id)
    step_rollup.rebuild(conn, CLUSTER, job_id)
    _same(_minutes(conn, job_id), ingested)
    assert queries.epoch_starts(conn, CLUSTER, job_id) == epochs


def test_a_job_stored_before_the_rollup_is_read_from_its_steps(conn: psycopg.Connection[Any], job_id: str) -> None:
    t0 = _minute_ago(20)
    start = ts_from_us(t0)
    PartitionKeeper().ensure(conn, "steps", {start.date(), ts_from_us(t0 + 3 * MINUTE_US).date()})
    conn.execute(
        """INSERT INTO steps (cluster, job_id, ts, rank, step, epoch, phase, duration_s)
           SELECT %s, %s, %s + make_interval(secs => t), t %% 2, t, t / 50, 'train', 0.5
           FROM generate_series(0, 179) t""",
        (CLUSTER, job_id, start),
    )
    rows = queries.step_series(conn, CLUSTER, job_id, points=2)
    assert sum(r["steps"] for r in rows) == 180 and {r["rank"] for r in rows} == {0, 1}
    assert [r["epoch"] for r in queries.epoch_starts(conn, CLUSTER, job_id)] == [0, 1, 2, 3]


def test_upgrade_and_downgrade(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url, "0004")
    migrate.upgrade(empty_database_url)
    job, start = f"m-{uuid.uuid4().hex[:8]}", dt.datetime(2026, 11, 24, 12, 0, 30, tzinfo=dt.UTC)
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        keeper = PartitionKeeper()
        keeper.ensure(conn, "steps", [start.date()])
        keeper.ensure(conn, "step_minutes", [start.date()])
        conn.execute(
            """INSERT INTO steps (cluster, job_id, ts, rank, step, epoch, duration_s)
               SELECT %s, %s, %s + make_interval(secs => t), NULL, t, t / 60, 0.5 FROM generate_series(0, 119) t""",
            (CLUSTER, job, start),
        )
        step_rollup.rebuild(conn, CLUSTER, job)
        assert [(r["rank"], r["steps"]) for r in conn.execute("SELECT * FROM step_minutes ORDER BY ts")] == [
            (-1, 30), (-1, 60), (-1, 30)]
        assert conn.execute("SELECT count(*) AS n FROM epoch_starts").fetchone() == {"n": 2}
    migrate.downgrade(empty_database_url, "0004")
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        gone = conn.execute("SELECT to_regclass('step_minutes') AS m, to_regclass('epoch_starts') AS e, "
                            "to_regclass('step_minutes_p20261124') AS p").fetchone()
        assert gone == {"m": None, "e": None, "p": None}
        assert conn.execute("SELECT count(*) AS n FROM steps").fetchone() == {"n": 120}
    migrate.upgrade(empty_database_url)
    assert migrate.autogenerate_diff(empty_database_url) == []
    with psycopg.connect(empty_database_url, autocommit=True, row_factory=dict_row) as conn:
        # No rollup rows after the upgrade: the job is read from its steps.
        rows = queries.step_series(conn, CLUSTER, job, points=2)
        assert sum(r["steps"] for r in rows) == 120
        assert [r["epoch"] for r in queries.epoch_starts(conn, CLUSTER, job)] == [0, 1]


def test_buckets_off_the_minute_take_each_minute_where_most_of_it_falls(
    client: Any, conn: psycopg.Connection[Any], job_id: str
) -> None:
    """Ten minutes of a step a second: five buckets over them are 120.000001 s wide. Each minute
    goes to the bucket that holds its middle, so the buckets differ from the steps' own by the
    one step on each boundary, not by a minute (a minute's start, 120 s, is in the bucket before
    its steps')."""
    t0 = _minute_ago(20)
    _post_all(client, [gz([_step(job_id, t0 + t * S, t, 0) for t in range(601)])])
    start, end = ts_from_us(t0), ts_from_us(t0 + 600 * S)
    statements = queries.step_series_statements(conn, CLUSTER, job_id, start=start, end=end, points=5)
    assert statements[0][1]["width"] == 120.000001
    rolled = [r["steps"] for r in queries.step_series(conn, CLUSTER, job_id, start=start, end=end, points=5)]
    raw = [r["steps"] for r in conn.execute(*statements[1]).fetchall()]
    assert rolled == [120, 120, 120, 120, 121] and raw == [121, 120, 120, 120, 120]
