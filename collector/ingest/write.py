"""Storing validated batches, several in one transaction (a group commit).

Each batch's id ``(source, seq)``, with its sender, goes into ``ingest_batches`` in the same transaction as
its rows (CONTRIBUTING rule 4), so a batch is stored completely once or not at all, however often
the agent retries it, and whichever group it lands in. A group writes one COPY per table,
one upsert of each GPU rollup (minutes, then hours), one of the step rollup
(:mod:`jobsight.collector.ingest.minute_rollup`), at most one write per job row and per epoch start,
for all its batches; see :mod:`jobsight.collector.ingest.group_commit` for how groups
form and what happens when one fails.

Rows are locked in one order in every group: batch ids, then job rows, then GPU minute rows,
GPU hour rows, step rollup rows and epoch starts, each sorted by key, so that concurrent groups (several
collector processes) wait for one another rather than deadlock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from psycopg.types.json import Jsonb

from jobsight.collector.ingest import minute_rollup, unallocated_uses
from jobsight.collector.ingest.rows import COPY_SQL, COPY_TYPES, SERIES_TABLES, PreparedBatch, copy_sql, prepare
from jobsight.collector.jobs import job_runs
from jobsight.collector.jobs.jobs_seen import JobKey, JobsSeen, Span, upsert_jobs
from jobsight.collector.jobs.summaries import mark_stale, refresh_ended
from jobsight.collector.store.db import Connection
from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.store.timestamps import ts_from_us
from jobsight.collector.tiers.step_rollup import EpochKey, EpochsSeen
from jobsight.protocol.wire import Batch
from jobsight.rules import job_states

# The names other modules (and tests) know this module by.
__all__ = ["COPY_TYPES", "PreparedBatch", "Seen", "Written", "copy_sql", "ensure_partitions", "prepare",
           "store_group", "ts_from_us"]
_SERIES_TABLES = SERIES_TABLES

Item = tuple[Batch, PreparedBatch]


@dataclass
class Written:
    """What a group's transaction did, for after it commits."""

    stored: list[bool]
    """Per batch, in the group's order: stored (``True``) or a replay (``False``)."""
    spans: dict[JobKey, Span] = field(default_factory=dict)
    """First and last record time of each job of the stored batches."""
    jobs: dict[JobKey, Span] = field(default_factory=dict)
    """The job rows written, and the times written to them."""
    epochs: dict[EpochKey, int] = field(default_factory=dict)
    """The epoch starts written."""


@dataclass(frozen=True)
class Seen:
    """What this collector process remembers having written, so that a group skips the rows
    every batch of a job would otherwise write (and every node of the job queue on)."""

    jobs: JobsSeen
    epochs: EpochsSeen


def ensure_partitions(conn: Connection, keeper: PartitionKeeper, prepared: PreparedBatch) -> None:
    """Make the partitions the batch's rows go to (``gpu_minutes``' come with ``gpu_hours``',
    see ``partitions.COMPANIONS``)."""
    for table, days in prepared.days.items():
        keeper.ensure(conn, table, days)


LEGACY_SENDER = "*"
"""The sender of ledger rows stored before senders were recorded (migration 0011): any sender."""
_LEGACY_RECHECK_S = 600.0


class _LegacyLedger:
    """Whether the ledger still holds rows of unknown sender, asked at most every
    :data:`_LEGACY_RECHECK_S`: a new install has none and never will (new rows name their sender),
    so its groups never pay for the look-up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked_at: float | None = None
        self._present = True

    def present(self, conn: Connection) -> bool:
        with self._lock:
            now = time.monotonic()
            if self._asked_at is not None and (not self._present or now - self._asked_at < _LEGACY_RECHECK_S):
                return self._present
            row = conn.execute("SELECT EXISTS (SELECT 1 FROM ingest_batches WHERE sender = %s) AS present",
                               (LEGACY_SENDER,)).fetchone()
            self._present, self._asked_at = bool(row and row["present"]), now
            return self._present


_LEGACY = _LegacyLedger()


def _stored_before_senders(conn: Connection, keys: Sequence[tuple[str, str, int]]) -> set[tuple[str, int]]:
    """The batch ids among ``keys`` that a row of unknown sender already holds."""
    if not keys or not _LEGACY.present(conn):
        return set()
    rows = conn.execute(
        "SELECT source, seq FROM ingest_batches WHERE sender = %s AND source = ANY(%s) AND seq = ANY(%s)",
        (LEGACY_SENDER, sorted({k[0] for k in keys}), sorted({k[2] for k in keys})),
    ).fetchall()
    return {(row["source"], row["seq"]) for row in rows}


def _claim(conn: Connection, items: Sequence[Item]) -> list[bool]:
    """Insert the batch ids; which batches are new. A batch id is its sender's ``(source, seq)``: one
    sender's batches never make another's duplicates. A batch id twice in one group is a replay
    the second time, as it would be in two requests one after the other."""
    first: dict[tuple[str, str, int], int] = {}
    for index, (batch, prepared) in enumerate(items):
        first.setdefault((batch.source, prepared.sender, batch.seq), index)
    old = _stored_before_senders(conn, list(first))
    keys = sorted(k for k in first if (k[0], k[2]) not in old)  # one lock order for every group
    claimed = conn.execute(
        "INSERT INTO ingest_batches (source, sender, seq, cluster, records) "
        "SELECT * FROM unnest(%s::text[], %s::text[], %s::int8[], %s::text[], %s::int4[]) "
        "ON CONFLICT (source, sender, seq) DO NOTHING RETURNING source, sender, seq",
        (
            [k[0] for k in keys],
            [k[1] for k in keys],
            [k[2] for k in keys],
            [items[first[k]][0].cluster for k in keys],
            [len(items[first[k]][0].records) for k in keys],
        ),
    ).fetchall()
    new = {first[(row["source"], row["sender"], row["seq"])] for row in claimed}
    return [index in new for index in range(len(items))]


def _spans(stored: Sequence[Item]) -> dict[JobKey, Span]:
    spans: dict[JobKey, Span] = {}
    for batch, prepared in stored:
        for job, (first, last) in prepared.jobs_seen.items():
            key = (batch.cluster, job)
            seen = spans.get(key)
            spans[key] = (first, last) if seen is None else (min(seen[0], first), max(seen[1], last))
    return spans


def _copy(conn: Connection, stored: Sequence[Item]) -> None:
    """One binary COPY per table for the whole group."""
    tables = sorted({table for _, prepared in stored for table, rows in prepared.rows.items() if rows})
    for table in tables:
        with conn.cursor() as cur, cur.copy(COPY_SQL[table]) as copy:
            copy.set_types(COPY_TYPES[table])
            write_row = copy.write_row
            for _, prepared in stored:
                for row in prepared.rows.get(table, ()):
                    write_row(row)


def _in_job_order(stored: Sequence[Item], started: bool) -> list[tuple[str, dict[str, Any]]]:
    """The group's ``job_started`` (or ``job_ended``) records with their clusters, by job; a
    stable sort, so one job's records keep their order."""
    records = [(b.cluster, r) for b, p in stored for r in (p.job_started if started else p.job_ended)]
    return sorted(records, key=lambda pair: (pair[0], pair[1]["job"]))


def store_group(conn: Connection, items: Sequence[Item], seen: Seen | None = None) -> Written:
    """Write the batches of ``items`` inside the caller's transaction; replays write nothing.

    ``seen`` says which job rows and epoch starts need a write (all of them without it); the
    caller tells it what was written (:class:`Written`) once the transaction has committed."""
    stored_flags = _claim(conn, items)
    stored = [item for item, new in zip(items, stored_flags, strict=True) if new]
    written = Written(stored_flags)
    if not stored:
        return written
    written.spans = _spans(stored)
    touched = {(b.cluster, r["job"]) for b, p in stored for r in (*p.job_started, *p.job_ended)}
    written.jobs = seen.jobs.due(written.spans, touched) if seen is not None else written.spans
    rollups = [(batch.cluster, prepared.minutes, prepared.step_minutes) for batch, prepared in stored]
    starts = minute_rollup.epoch_starts(rollups)
    written.epochs = seen.epochs.due(starts) if seen is not None else starts
    upsert_jobs(conn, written.jobs)
    for cluster, record in _in_job_order(stored, started=True):
        job_runs.started(conn, cluster, record)  # a requeued job's next run starts anew
        _job_started(conn, cluster, record)
    _copy(conn, stored)
    # What follows the COPY needs no result until the summary check: one pipeline sends it all
    # and waits once, where each statement used to be a round trip of its own.
    with conn.pipeline():
        minute_rollup.write(conn, rollups, written.epochs)
        for batch, prepared in stored:
            for record in prepared.profiles:
                _profile(conn, batch.cluster, record)
            unallocated_uses.insert(conn, batch.cluster, prepared.unallocated_uses)
        for cluster, record in _in_job_order(stored, started=False):
            if job_runs.is_current(conn, cluster, record):  # an earlier run's end must not end this run
                _job_ended(conn, cluster, record)
        # An ended job's summary is computed here at its job_ended; later rows only mark it for the refresh
        # pass (collector/jobs/summaries.py), which recomputes it at most once per interval.
        ending = {(cluster, record["job"]) for cluster, record in _in_job_order(stored, started=False)}
        for cluster in sorted({key[0] for key in written.spans}):
            jobs = sorted(job for c, job in written.spans if c == cluster)
            refresh_ended(conn, cluster, [job for job in jobs if (cluster, job) in ending])
            mark_stale(conn, cluster, [job for job in jobs if (cluster, job) not in ending])
    return written


def _job_started(conn: Connection, cluster: str, r: dict[str, Any]) -> None:
    """Merge a ``job_started`` into the job's row. Once a prolog registered the job (a record with
    ``user``, which job tokens cannot set), ``nodes`` is its Slurm allocation, which node tokens
    are authorised against (``queries.job_allocations``): run metadata no longer widens it."""
    nodes = r.get("nodes") or ([r["node"]] if r.get("node") else None)
    conn.execute(
        """UPDATE jobs SET user_name = coalesce(%(user)s, user_name), uid = coalesce(%(uid)s, uid),
               account = coalesce(%(account)s, account), partition = coalesce(%(partition)s, partition),
               -- name and demo are Slurm's once a prolog registered the job: the first prolog's replace what
               -- run metadata said before it, and run metadata (no user) never changes them after it
               name = CASE WHEN user_name IS NULL AND %(user)s::text IS NOT NULL THEN %(name)s
                           WHEN user_name IS NOT NULL AND %(user)s::text IS NULL THEN name
                           ELSE coalesce(%(name)s, name) END,
               demo = CASE WHEN user_name IS NULL AND %(user)s::text IS NOT NULL THEN %(demo)s
                           WHEN user_name IS NOT NULL AND %(user)s::text IS NULL THEN demo
                           ELSE demo OR %(demo)s END,
               node_count = coalesce(%(node_count)s, node_count),
               qos = coalesce(%(qos)s, qos), comment = coalesce(%(comment)s, comment),
               batch = coalesce(%(batch)s, batch),
               time_limit_s = coalesce(%(time_limit_s)s, time_limit_s),
               attrs = coalesce(attrs, '{}'::jsonb) || coalesce(%(attrs)s, '{}'::jsonb),
               nodes = CASE
                   WHEN cardinality(%(nodes)s::text[]) = 0 THEN nodes
                   -- the first registration: its allocation replaces the nodes seen so far
                   WHEN user_name IS NULL AND %(user)s::text IS NOT NULL
                       THEN (SELECT array_agg(DISTINCT n ORDER BY n) FROM unnest(%(nodes)s::text[]) n)
                   -- another node's prolog (the same list), or nodes seen before any registration
                   WHEN user_name IS NULL OR %(user)s::text IS NOT NULL
                       THEN (SELECT array_agg(DISTINCT n ORDER BY n)
                             FROM unnest(coalesce(nodes, '{}') || %(nodes)s::text[]) n)
                   ELSE nodes END,  -- run metadata on a registered job: the allocation stays
               gpus = (SELECT array_agg(DISTINCT g ORDER BY g)
                       FROM unnest(coalesce(gpus, '{}') || %(gpus)s::text[]) g),
               start_time = CASE
                   -- no prolog: earliest record
                   WHEN user_name IS NULL AND %(user)s::text IS NULL THEN least(start_time, %(ts)s)
                   WHEN user_name IS NULL THEN %(ts)s  -- the first prolog registers the job: its time is the start
                   WHEN %(user)s::text IS NOT NULL THEN least(start_time, %(ts)s)  -- another node's prolog
                   ELSE start_time END,  -- run metadata on a registered job
               state = CASE WHEN end_time IS NULL THEN 'running' ELSE state END
           WHERE cluster = %(cluster)s AND job_id = %(job)s""",
        {
            "user": r.get("user"),
            "uid": r.get("uid"),
            "account": r.get("account"),
            "partition": r.get("partition"),
            "name": r.get("name"),
            "qos": r.get("qos"),
            "comment": r.get("comment"),
            "batch": r.get("batch"),
            "node_count": r.get("node_count"),
            "time_limit_s": r.get("time_limit_s"),
            "demo": bool(r.get("demo")),
            "attrs": _attrs(r),
            "nodes": nodes or [],
            "gpus": [f"{r.get('node') or ''}:{g}" for g in (r.get("gpus") or [])],
            "ts": r["ts"],
            "cluster": cluster,
            "job": r["job"],
        },
    )


def _attrs(r: dict[str, Any]) -> Jsonb | None:
    """What a ``job_started`` adds to the job's ``attrs``: its own, and the prolog's ``sluid`` (the run's
    SLUID, a wire field only node tokens may set: docs/security.md) under the key ``sluid``. A ``sluid``
    key in a record's own ``attrs`` (run metadata, which job tokens write) is left out, so the stored one
    is always the prolog's."""
    attrs, sluid = r.get("attrs"), r.get("sluid")
    if isinstance(attrs, dict) and "sluid" in attrs:
        attrs = {key: value for key, value in attrs.items() if key != "sluid"}
    if sluid is not None and (attrs is None or isinstance(attrs, dict)):
        attrs = {**(attrs or {}), "sluid": sluid}
    # attrs that are not an object (the wire takes any JSON value) have no key for it; no prolog sends both.
    return Jsonb(attrs) if attrs is not None else None


# The stored state gives way to one at least as specific (jobsight/rules/job_states.py), in one statement:
# records of one job's end arrive in any order, from every node's epilog and from reconciliation.
_HEARD_WINS = f"{job_states.rank_sql('%(state)s::text')} >= {job_states.rank_sql('state')}"


def _job_ended(conn: Connection, cluster: str, r: dict[str, Any]) -> None:
    exit_code = r.get("exit_code")
    # The epilog sends Slurm's name (TIMEOUT, OUT_OF_MEMORY); an unknown one or none: the exit code says.
    state = job_states.from_slurm(r.get("state") or "") or (
        job_states.COMPLETED if exit_code in (0, None) else job_states.FAILED)
    conn.execute(
        f"""UPDATE jobs SET end_time = greatest(coalesce(end_time, %(ts)s), %(ts)s),
               exit_code = CASE WHEN {_HEARD_WINS} THEN coalesce(%(exit_code)s, exit_code) ELSE exit_code END,
               state = CASE WHEN {_HEARD_WINS} THEN %(state)s ELSE state END,
               last_seen = greatest(last_seen, %(ts)s)
           WHERE cluster = %(cluster)s AND job_id = %(job)s""",
        {"ts": r["ts"], "exit_code": exit_code, "state": state, "cluster": cluster, "job": r["job"]},
    )
    conn.execute(
        """UPDATE profile_requests SET state = 'failed', reason = 'the job ended before the profile was taken',
               updated_at = now()
           WHERE cluster = %s AND job_id = %s AND state IN ('pending', 'running')""",
        (cluster, r["job"]),
    )


def _profile(conn: Connection, cluster: str, r: dict[str, Any]) -> None:
    conn.execute(
        """INSERT INTO profiles (cluster, job_id, ts, node, rank, pid, profile_id, request_id,
               step_start, step_end, summary, diagnosis, trace_gz, note)
           VALUES (%(cluster)s, %(job)s, %(ts)s, %(node)s, %(rank)s, %(pid)s, %(profile_id)s, %(request_id)s,
               %(step_start)s, %(step_end)s, %(summary)s, %(diagnosis)s, %(trace_gz)s, %(note)s)""",
        {
            "cluster": cluster,
            "job": r["job"],
            "ts": r["ts"],
            "node": r.get("node"),
            "rank": r.get("rank"),
            "pid": r.get("pid"),
            "profile_id": r["profile_id"],
            "request_id": r.get("request_id"),
            "step_start": r.get("step_start"),
            "step_end": r.get("step_end"),
            "summary": Jsonb(r["summary"]),
            "diagnosis": Jsonb(r["diagnosis"]) if r.get("diagnosis") is not None else None,
            "trace_gz": r.get("trace_gz"),
            "note": r.get("note"),
        },
    )
    if r.get("request_id") is not None:
        # The profile an on-demand request asked for: the request is done, in this transaction.
        conn.execute(
            """UPDATE profile_requests SET state = 'done', profile_id = %(profile_id)s, reason = NULL,
                   updated_at = now()
               WHERE id = %(request_id)s AND cluster = %(cluster)s AND job_id = %(job)s
                 AND state IN ('pending', 'running')""",
            {"profile_id": r["profile_id"], "request_id": r["request_id"], "cluster": cluster, "job": r["job"]},
        )

