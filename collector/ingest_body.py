"""From the raw ``POST /v1/ingest`` body to a validated, prepared batch.

Reading the body is asynchronous and bounded (:func:`read_body`); the rest (gunzip,
JSON parsing, validation, turning records into rows) is CPU work on up to
``max_decompressed_bytes`` of JSON, so :func:`decode_body` runs in a worker thread
and the event loop keeps answering (``/healthz``, other batches) meanwhile.

Both limits mean "smaller than": a body of exactly ``max_body_bytes``, or one inflating
to exactly ``max_decompressed_bytes``, is refused (413).
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator
from typing import Any, Final

import orjson

from jobsight.collector import ingest
from jobsight.collector.errors import BadBody, BodyTooLarge
from jobsight.protocol.wire import Batch, WireError, decode_batch, loads_batch

GZIP_MAGIC: Final = b"\x1f\x8b"


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


def decode_body(body: bytes, encoding: str | None, limit: int) -> tuple[Batch, ingest.PreparedBatch]:
    """Inflate, parse, validate and prepare one batch; blocking, for a worker thread.

    Raises :class:`BadBody` (400) when the body is not a batch at all, :class:`BodyTooLarge`
    (413), :class:`~jobsight.protocol.wire.WireError` (422) naming the record and field."""
    raw = decompress(body, encoding, limit)
    try:
        batch = decode_batch(raw, loads=parse_json)
        prepared = ingest.prepare(batch)
    except WireError as exc:
        if exc.record is None and exc.field is None:
            raise BadBody(exc.message) from exc
        raise
    return batch, prepared
