"""From the raw ``POST /v1/ingest`` body to a validated, prepared batch.

Reading the body is asynchronous and bounded (:func:`read_body`); the rest (gunzip,
JSON parsing, validation, turning records into rows) is CPU work on up to
``max_decompressed_bytes`` of JSON, so :func:`decode_body` runs in a worker thread
and the event loop keeps answering (``/healthz``, other batches) meanwhile.

Both limits mean "smaller than": a body of exactly ``max_body_bytes``, or one inflating
to exactly ``max_decompressed_bytes``, is refused (413).

What one job may claim is bounded here too (:func:`check_claims`, the one place): a record's
``gpu_index`` and ``rank`` stay under ``max_gpus_per_job`` and ``max_ranks_per_job``, and a
``job_started`` lists at most ``max_gpus_per_job`` GPUs; past that, 422 naming the record and field.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Final

import orjson

from jobsight.collector.config.settings import DEFAULT_MAX_GPUS_PER_JOB, DEFAULT_MAX_RANKS_PER_JOB, CollectorSettings
from jobsight.collector.ingest import write as ingest
from jobsight.protocol.wire import Batch, WireError, decode_batch, loads_batch

GZIP_MAGIC: Final = b"\x1f\x8b"


class BadBody(ValueError):
    """The body cannot be read as a batch at all (broken gzip or JSON): 400."""


class BodyTooLarge(ValueError):
    """The body is over the size limit, before or after decompression: 413."""


async def read_body(chunks: AsyncIterator[bytes], declared: str | None, limit: int) -> bytes:
    """The raw body from its ``chunks``, refusing to buffer ``limit`` bytes or more
    (``declared``: the request's ``Content-Length``, when it has one)."""
    if declared and declared.isdigit() and int(declared) >= limit:
        raise BodyTooLarge(f"body of {declared} bytes is not under the limit of {limit} bytes")
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size >= limit:
            raise BodyTooLarge(f"body is not under the limit of {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


def parse_json(raw: bytes) -> Any:
    """orjson for speed; on a body it refuses, the standard library, which parses NaN and
    Infinity so that validation can name the record and field that hold them."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return loads_batch(raw)


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    """Gunzip with a ceiling, so a small bomb cannot expand into memory. Exactly one gzip
    member: a second one, or anything after the first, is refused rather than ignored
    (what follows a valid batch would otherwise pass unseen)."""
    if (encoding or "").lower() != "gzip" and body[:2] != GZIP_MAGIC:
        if len(body) >= limit:
            raise BodyTooLarge(f"body is not under the decompressed limit of {limit} bytes")
        return body
    inflater = zlib.decompressobj(wbits=31)
    try:
        # At most `limit` bytes out: reaching it is over the limit, whatever would follow.
        out = inflater.decompress(body, limit)
    except zlib.error as exc:
        raise BadBody(f"body is not valid gzip: {exc}") from exc
    if len(out) >= limit:
        raise BodyTooLarge(f"body decompresses to {limit} bytes or more (the limit is under {limit})")
    if not inflater.eof:
        raise BadBody("body is truncated gzip")
    trailing = inflater.unused_data
    if trailing[:2] == GZIP_MAGIC:
        raise BadBody("body holds a second gzip member after the batch; send one gzip member per request")
    if trailing:
        raise BadBody(f"body has {len(trailing)} bytes of trailing data after the gzip stream")
    return out


@dataclass(frozen=True, slots=True)
class ClaimBounds:
    """How much of the cluster one job's records may claim (``CollectorSettings.max_gpus_per_job``
    and ``max_ranks_per_job``; the defaults are theirs)."""

    gpus: int = DEFAULT_MAX_GPUS_PER_JOB
    ranks: int = DEFAULT_MAX_RANKS_PER_JOB

    @classmethod
    def of(cls, settings: CollectorSettings) -> ClaimBounds:
        return cls(settings.max_gpus_per_job, settings.max_ranks_per_job)


DEFAULT_BOUNDS: Final = ClaimBounds()
_RANKED_KINDS: Final = ("log", "metric", "step", "profile")


@dataclass(frozen=True, slots=True)
class _Claim:
    """One bound: the ``field`` of records of ``kind`` stays under ``bound`` (an index) or, for a
    list, holds at most ``bound`` items."""

    kind: str
    field: str
    bound: int
    setting: str
    is_list: bool = False

    def past(self, value: Any) -> bool:
        return len(value) > self.bound if self.is_list else int(value) >= self.bound

    def any_past(self, column: list[Any]) -> bool:
        """Whether a value of ``column`` (``None`` for an absent field) is past the bound, in C:
        ``filter(None, …)`` drops the ``None`` (and the 0 and empty lists, never past it)."""
        present = filter(None, column)
        if self.is_list:
            return max(map(len, present), default=0) > self.bound
        return bool(max(present, default=0) >= self.bound)

    def problem(self, value: Any) -> str:
        if self.is_list:
            return f"lists {len(value)} items, more than the collector's {self.setting} of {self.bound}"
        return f"{value} is past the collector's {self.setting}: it must be under {self.bound}"


def _claims(bounds: ClaimBounds) -> list[_Claim]:
    gpus = "max_gpus_per_job"
    return [_Claim("gpu_sample", "gpu_index", bounds.gpus, gpus),
            _Claim("gpu_event", "gpu_index", bounds.gpus, gpus),
            _Claim("job_started", "gpus", bounds.gpus, gpus, is_list=True),
            *(_Claim(kind, "rank", bounds.ranks, "max_ranks_per_job") for kind in _RANKED_KINDS)]


def _column(batch: Batch, kind: str, field: str) -> list[Any]:
    """The field of every record of ``kind``: the column validation made when it made them (the
    usual batch), else read from the records."""
    if batch.columns is not None:
        return batch.columns.get(kind, {}).get(field) or []
    return [r.get(field) for r in batch.records if r.get("kind") == kind]


def _first_past(batch: Batch, claim: _Claim) -> tuple[int, Any] | None:
    for index, record in enumerate(batch.records):
        value = record.get(claim.field) if record.get("kind") == claim.kind else None
        if value is not None and claim.past(value):
            return index, value
    return None


def check_claims(batch: Batch, bounds: ClaimBounds) -> None:
    """Refuse the batch (:class:`~jobsight.protocol.wire.WireError`, 422) at its first record
    that claims more than ``bounds`` allow one job. Stateless and cheap: each record is judged on
    its own values, a column at a time; the records are scanned only to name the one at fault."""
    for claim in _claims(bounds):
        if not claim.any_past(_column(batch, claim.kind, claim.field)):
            continue
        found = _first_past(batch, claim)
        if found is not None:
            index, value = found
            raise WireError(f"{claim.field} {claim.problem(value)}", index, claim.field)


def decode_body(
    body: bytes, encoding: str | None, limit: int, bounds: ClaimBounds = DEFAULT_BOUNDS
) -> tuple[Batch, ingest.PreparedBatch]:
    """Inflate, parse, validate, bound (:func:`check_claims`) and prepare one batch; blocking,
    for a worker thread. ``bounds``: the collector's (:meth:`ClaimBounds.of` its settings).

    Raises :class:`BadBody` (400) when the body is not a batch at all, :class:`BodyTooLarge`
    (413), :class:`~jobsight.protocol.wire.WireError` (422) naming the record and field."""
    raw = decompress(body, encoding, limit)
    try:
        batch = decode_batch(raw, loads=parse_json)
        check_claims(batch, bounds)
        prepared = ingest.prepare(batch)
    except WireError as exc:
        if exc.record is None and exc.field is None:
            raise BadBody(exc.message) from exc
        raise
    return batch, prepared
