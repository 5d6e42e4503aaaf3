"""A batch's way in, from body to commit: :func:`ingest_batch`, the one entry the HTTP route calls.

The steps, in this order:

1. the body read, bounded (:func:`~jobsight.collector.ingest.body.read_body`), then inflated, parsed,
   validated and turned into rows in a decode thread (:func:`~jobsight.collector.ingest.body.decode_body`);
2. its records judged against what the sender may write (:mod:`jobsight.collector.ingest.write_rights`),
   with the registrations of its jobs: a node's records it may not write are dropped and the rest
   prepared again; a job's or an admin's batch is refused whole
   (:class:`~jobsight.collector.ingest.write_rights.AuthError`);
3. a registered job's own hardware samples turned into self-reported metrics
   (:mod:`jobsight.collector.ingest.self_reported`);
4. the partitions of its days made, when the keeper lacks one;
5. the batch handed to the group commit (:mod:`jobsight.collector.ingest.group_commit`), and its
   :class:`Outcome` once its group has committed.

The route translates HTTP to this call and the outcome back to HTTP (the answer, the metrics);
every error is raised as it is, for the api's error answers. The running parts these steps use
(:class:`Intake`) start and stop with the app.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

# What FastAPI's run_in_threadpool is: the event loop's worker threads, shared with the app's
# blocking handlers, without the web framework in this room.
from anyio.to_thread import run_sync
from psycopg_pool import ConnectionPool

from jobsight.collector.config.settings import CollectorSettings
from jobsight.collector.ingest import self_reported
from jobsight.collector.ingest.body import ClaimBounds, decode_body, read_body
from jobsight.collector.ingest.group_commit import GroupCommitter
from jobsight.collector.ingest.rows import PreparedBatch, prepare_without
from jobsight.collector.ingest.write import ensure_partitions
from jobsight.collector.ingest.write_rights import (
    Principal,
    Refusal,
    authorize_batch,
    batch_jobs_to_check,
    sender_of,
)
from jobsight.collector.jobs.allocations import Allocation, AllocationCache, job_allocations
from jobsight.collector.jobs.jobs_seen import JobsSeen
from jobsight.collector.store.db import Connection, autocommit_connection, unit_of_work
from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.protocol.wire import Batch


@dataclass(frozen=True, slots=True)
class Intake:
    """The running parts of one collector process that a batch goes through: the threads batches
    are decoded in, the group committer, the cache of job registrations, and what they use."""

    settings: CollectorSettings
    pool: ConnectionPool[Connection]
    keeper: PartitionKeeper
    decoders: ThreadPoolExecutor
    committer: GroupCommitter
    allocations: AllocationCache

    def stop(self) -> None:
        """Write what is queued and end the writers, then the decode threads. Blocking (run it in a
        thread), and before the pool closes."""
        self.committer.stop()
        self.decoders.shutdown(wait=False, cancel_futures=True)


def start_intake(pool: ConnectionPool[Connection], keeper: PartitionKeeper, settings: CollectorSettings) -> Intake:
    """Start the group commit's writers and the decode threads over an open ``pool``."""
    committer = GroupCommitter(
        pool,
        wait_s=settings.group_commit_wait_ms / 1000,
        max_batches=settings.group_commit_max_batches,
        max_records=settings.group_commit_max_records,
        jobs=JobsSeen(),
        flush_every_s=settings.last_seen_flush_s,
        writers=settings.group_commit_writers,
    )
    committer.start()
    # Inflating, parsing and validating up to max_decompressed_bytes is seconds of CPU for the
    # largest bodies: in these threads, so the event loop keeps answering, and at most
    # max_concurrent_decodes at once (one a thread), so a burst cannot inflate them all.
    decoders = ThreadPoolExecutor(settings.max_concurrent_decodes, thread_name_prefix="jobsight-decode")
    return Intake(settings, pool, keeper, decoders, committer, AllocationCache())


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of a batch."""

    batch: Batch
    """The batch as stored: without the records refused, a registered job's own samples as metrics."""
    stored: bool
    """``False``: a replay of a batch its sender had stored before; nothing was written."""
    counts: Mapping[str, int]
    """The stored records by kind."""
    refused: list[Refusal]
    """The records of a node token's batch that it may not write, dropped (empty for other tokens)."""
    sender: str
    """Who sent it, as the ledger keys it (:func:`~jobsight.collector.ingest.write_rights.sender_of`)."""


def _job_allocations(intake: Intake, cluster: str, job_ids: list[str]) -> dict[str, Allocation]:
    def read(cluster: str, missing: list[str]) -> dict[str, Allocation]:
        with unit_of_work(intake.pool) as conn:
            return job_allocations(conn, cluster, missing)

    return intake.allocations.get(cluster, job_ids, read)


def _self_reported(principal: Principal, batch: Batch, allocations: Mapping[str, Allocation] | None) -> bool:
    """Whether a job token sends hardware samples of a job a prolog registered: its node daemon
    samples those, and the job's own word is kept only as self-reported metrics."""
    return (principal.kind == "job" and allocations is not None and allocations.get(principal.job or "") is not None
            and self_reported.has_samples(batch))


def _ensure_partitions(intake: Intake, prepared: PreparedBatch) -> None:
    # Partition DDL needs its own autocommit connection, outside the group's transaction.
    with autocommit_connection(intake.pool) as conn:
        ensure_partitions(conn, intake.keeper, prepared)


async def ingest_batch(
    intake: Intake, principal: Principal, chunks: AsyncIterator[bytes], declared_length: str | None,
    encoding: str | None,
) -> Outcome:
    """Read, decode, authorise and store one batch sent by ``principal`` (``declared_length``: the
    request's ``Content-Length``; ``encoding``: its ``Content-Encoding``). Raises what the api
    answers with 4xx and 503 (:func:`~jobsight.collector.api.errors.error_answer`)."""
    settings, loop = intake.settings, asyncio.get_running_loop()
    with intake.committer.arriving() as arrival:
        body = await read_body(chunks, declared_length, settings.max_body_bytes)
        batch, prepared = await loop.run_in_executor(
            intake.decoders, decode_body, body, encoding, settings.max_decompressed_bytes, ClaimBounds.of(settings)
        )
        del body  # the raw body is not needed while the batch is stored
        to_check = batch_jobs_to_check(principal, batch)
        allocations = intake.allocations.cached(batch.cluster, to_check) if to_check else None
        if to_check and allocations is None:
            allocations = await run_sync(_job_allocations, intake, batch.cluster, to_check)
        refused = authorize_batch(principal, batch, allocations)
        if refused:  # a node's records it may not write: dropped, the rest prepared again and stored
            batch, prepared = await loop.run_in_executor(
                intake.decoders, prepare_without, batch, {r.index for r in refused})
        if _self_reported(principal, batch, allocations):
            batch, prepared = self_reported.as_self_reported(batch)
        prepared.sender = sender_of(principal)
        # Almost every batch lands in days whose partitions exist already: ask the keeper
        # before taking a connection.
        if any(intake.keeper.missing(table, days) for table, days in prepared.days.items()):
            await run_sync(_ensure_partitions, intake, prepared)
        future = intake.committer.submit(arrival, batch, prepared)
    # Done once the batch's group has committed (or with its own transaction's error).
    stored = await asyncio.wrap_future(future)
    if prepared.counts.get("job_started"):
        intake.allocations.forget(batch.cluster, {r["job"] for r in batch.records if r["kind"] == "job_started"})
    return Outcome(batch, stored, prepared.counts, refused, prepared.sender)
