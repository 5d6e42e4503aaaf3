"""Serving a stored profiler trace inflated, without letting it inflate without bound.

Traces are stored as the gzip the agent sent. ``format=json`` inflates one on the way
out: a 0.5 MB trace can hold 512 MiB of JSON, so the trace is inflated twice, in
bounded chunks: once to measure it (and to find a broken one) before the answer starts,
once to stream it. Memory stays at one chunk whatever the trace holds.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Final

from jobsight.protocol.wire import MAX_TRACE_INFLATED

GZIP_MAGIC: Final = b"\x1f\x8b"
MAX_TRACE_JSON_BYTES: Final = MAX_TRACE_INFLATED
"""The most a stored trace may inflate to for ``format=json``: what ingest lets a trace
inflate to, so every trace stored now can be served inflated; larger ones (stored before
ingest checked) are served as stored (``format=gz``)."""
_CHUNK: Final = 1024 * 1024


class TraceUnreadable(ValueError):
    """A stored trace that cannot be served inflated (broken gzip, or over the cap): 422."""


def _inflate(blob: bytes, cap: int) -> Iterator[bytes]:
    """The inflated trace in chunks of at most ``_CHUNK`` bytes; gzip members one after
    another, as ``gzip.decompress`` reads them. Raises :class:`TraceUnreadable`."""
    data = blob
    produced = 0
    while True:
        inflater = zlib.decompressobj(wbits=31)
        try:
            while not inflater.eof:
                chunk = inflater.decompress(data, _CHUNK)
                data = inflater.unconsumed_tail
                if not chunk and not data and not inflater.eof:
                    # All input read, nothing more coming out, and no end of stream.
                    raise TraceUnreadable("the stored trace is truncated gzip; download it as stored (format=gz)")
                produced += len(chunk)
                if produced > cap:
                    raise TraceUnreadable(
                        f"the trace inflates to more than {cap // (1024 * 1024)} MiB; download it as stored "
                        "(format=gz) and open it with a tool that reads gzip"
                    )
                if chunk:
                    yield chunk
        except zlib.error as exc:
            raise TraceUnreadable(
                f"the stored trace is not valid gzip ({exc}); download it as stored (format=gz)"
            ) from exc
        data = inflater.unused_data
        if not data:
            return
        if data[:2] != GZIP_MAGIC:
            raise TraceUnreadable("the stored trace has data after its gzip stream; download it as stored (format=gz)")


def inflated_size(blob: bytes, cap: int = MAX_TRACE_JSON_BYTES) -> int:
    """The size of the inflated trace, read through once in bounded chunks; raises
    :class:`TraceUnreadable` for broken gzip or a trace over ``cap`` bytes inflated."""
    return sum(len(chunk) for chunk in _inflate(blob, cap))


def inflated_chunks(blob: bytes, cap: int = MAX_TRACE_JSON_BYTES) -> Iterator[bytes]:
    """The inflated trace as chunks, for a streamed answer; call :func:`inflated_size` first
    so that a trace that cannot be served fails before the answer starts."""
    return _inflate(blob, cap)
