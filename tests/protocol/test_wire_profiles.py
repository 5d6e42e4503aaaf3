"""A profile record's trace, summary and diagnosis hold what readers of them expect.

The trace must be base64 of one complete gzip stream that inflates to at most
``wire.MAX_TRACE_INFLATED`` bytes (checked a chunk at a time: a bomb is never inflated whole),
the summary a JSON object, the diagnosis a list of hints.
"""

from __future__ import annotations

import base64
import gzip
import tracemalloc
import zlib
from typing import Any

import pytest

from jobsight.protocol import wire
from jobsight.protocol.wire import WireError

NOW = wire.now_us()
TRACE = gzip.compress(b'{"traceEvents": [{"name": "ProfilerStep#1", "ph": "X"}]}')


def _profile(**fields: Any) -> dict[str, Any]:
    return {"kind": "profile", "job": "1", "ts": NOW, "profile_id": "p", "summary": {"steps": 2}, **fields}


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _refused(record: dict[str, Any]) -> WireError:
    with pytest.raises(WireError) as caught:
        wire.validate_record(record, 2, NOW)
    return caught.value


def test_a_profile_with_a_trace_summary_and_hints_is_taken() -> None:
    record = _profile(trace_gz_b64=_b64(TRACE), diagnosis=[{"rule": "input_bound", "severity": "warning"}])
    assert wire.validate_record(record, 0, NOW) is record
    wire.validate_record(_profile(diagnosis=[]), 0, NOW)
    wire.validate_record(_profile(diagnosis=None, trace_gz_b64=None), 0, NOW)


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        ("!!!", "not valid base64"),
        ("données", "not valid base64"),
        (_b64(b'{"traceEvents": []}'), "not a valid gzip stream"),
        ("", "not a complete gzip stream"),
        (_b64(TRACE[:-6]), "not a complete gzip stream"),
        (_b64(TRACE + b"trailing"), "trailing bytes after the gzip stream"),
        (_b64(TRACE + TRACE), "trailing bytes after the gzip stream"),
        (_b64(zlib.compress(b'{"traceEvents": []}')), "not a valid gzip stream"),
    ],
    ids=["not-base64", "not-ascii", "not-gzip", "empty", "truncated", "trailing-bytes", "second-member",
         "zlib-not-gzip"],
)
def test_a_trace_that_is_not_one_gzip_stream_is_refused(blob: str, message: str) -> None:
    error = _refused(_profile(trace_gz_b64=blob))
    assert (error.record, error.field) == (2, "trace_gz_b64")
    assert error.message.startswith(message), error.message


def _bomb(inflated: int) -> bytes:
    """A gzip stream of ``inflated`` zero bytes, made a MiB at a time (level 1: quick, and still
    about 1/200 the size)."""
    packer = zlib.compressobj(1, zlib.DEFLATED, 31)
    chunk = bytes(1024 * 1024)
    parts = [packer.compress(chunk) for _ in range(inflated // len(chunk))]
    parts.append(packer.compress(bytes(inflated % len(chunk))))
    parts.append(packer.flush())
    return b"".join(parts)


def test_a_gzip_bomb_is_refused_without_inflating_it_whole() -> None:
    bomb = _bomb(wire.MAX_TRACE_INFLATED + 1)
    assert len(_b64(bomb)) <= wire.MAX_TRACE_B64  # under the cap on the wire: only inflating finds it
    record = _profile(trace_gz_b64=_b64(bomb))
    tracemalloc.start()
    try:
        error = _refused(record)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (error.field, error.message) == (
        "trace_gz_b64", f"trace inflates to more than {wire.MAX_TRACE_INFLATED} bytes"
    )
    assert peak < 16 * 1024 * 1024, peak  # a chunk or two, not 256 MiB


def test_a_trace_of_exactly_the_cap_is_taken() -> None:
    wire.validate_record(_profile(trace_gz_b64=_b64(_bomb(wire.MAX_TRACE_INFLATED))), 0, NOW)


@pytest.mark.parametrize("summary", [[], "summary", 3, [{"steps": 2}]])
def test_a_summary_that_is_not_an_object_is_refused(summary: Any) -> None:
    error = _refused(_profile(summary=summary))
    assert (error.record, error.field, error.message) == (2, "summary", "expected a JSON object")


@pytest.mark.parametrize(
    ("diagnosis", "message"),
    [
        ({"rule": "input_bound"}, "expected a list of hints"),
        ("input_bound", "expected a list of hints"),
        (["input_bound"], "expected each hint to be an object with a string rule"),
        ([{"rule": 7}], "expected each hint to be an object with a string rule"),
        ([{"title": "no rule"}], "expected each hint to be an object with a string rule"),
        ([{"rule": "ok"}, None], "expected each hint to be an object with a string rule"),
    ],
)
def test_a_diagnosis_that_is_not_a_list_of_hints_is_refused(diagnosis: Any, message: str) -> None:
    error = _refused(_profile(diagnosis=diagnosis))
    assert (error.record, error.field, error.message) == (2, "diagnosis", message)
