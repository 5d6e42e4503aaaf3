"""Strings PostgreSQL cannot store, and JSON the parser cannot take, are refused by validation.

PostgreSQL stores text as UTF-8, which has no encoding for a lone surrogate (U+D800..U+DFFF);
Python's ``json`` parses the escape ``"\\udcff"`` into one. Such a body used to pass validation
and fail at COPY: a 500, which the sender retries for ever. Now it is a ``WireError`` naming
the record and field (a 422).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from jobsight.protocol import wire
from jobsight.protocol.checks import LONE_SURROGATE
from jobsight.protocol.wire import WireError

NOW = wire.now_us()


def _log(**fields: Any) -> dict[str, Any]:
    return {"kind": "log", "job": "1", "ts": NOW, "level": "INFO", "message": "ok", **fields}


def _body(records: list[Any], **envelope: Any) -> bytes:
    # json.dumps writes a lone surrogate as its escape, "\udcff", as a hostile body holds it.
    return json.dumps({"v": 1, "source": "s", "seq": 1, "records": records, **envelope}).encode()


def _refused(body: bytes) -> WireError:
    with pytest.raises(WireError) as caught:
        wire.decode_batch(body, NOW)
    return caught.value


@pytest.mark.parametrize(
    ("record", "field"),
    [
        (_log(message="data-\udcff.bin"), "message"),
        (_log(logger="train-\udcff"), "logger"),
        (_log(thread="\ud800"), "thread"),
        (_log(level="INFO\udfff"), "level"),
        (_log(exception="Traceback\n  File \udcff"), "exception"),
        (_log(job="12\udcff"), "job"),
        (_log(node="node-\udcff"), "node"),
        (_log(attrs={"file": "data-\udcff.bin"}), "attrs"),
        (_log(attrs={"deep": [{"name": ["\udcff"]}]}), "attrs"),
        (_log(attrs={"key-\udcff": 1}), "attrs"),
        ({"kind": "metric", "job": "1", "ts": NOW, "name": "loss-\udcff", "value": 1.0}, "name"),
        ({"kind": "job_started", "job": "1", "ts": NOW, "nodes": ["n1", "n\udcff"]}, "nodes"),
        ({"kind": "profile", "job": "1", "ts": NOW, "profile_id": "p", "summary": {"op": "\udcff"}}, "summary"),
    ],
    ids=["text", "str", "high-surrogate", "level", "exception", "job-id", "node", "json-value", "json-nested",
         "json-key", "metric-name", "str-list-item", "profile-summary"],
)
def test_a_lone_surrogate_in_any_record_string_is_refused(record: dict[str, Any], field: str) -> None:
    error = _refused(_body([_log(), record]))
    assert (error.record, error.field, error.message) == (1, field, LONE_SURROGATE)


@pytest.mark.parametrize("field", ["source", "cluster"])
def test_a_lone_surrogate_in_the_envelope_is_refused(field: str) -> None:
    error = _refused(_body([_log()], **{field: "node42-\udcff"}))
    assert (error.record, error.field, error.message) == (None, field, LONE_SURROGATE)


def test_text_that_is_not_ascii_is_taken() -> None:
    """Only a lone surrogate is refused: accents, CJK, and an emoji written as its surrogate pair
    (which JSON joins into one code point) all store fine."""
    records = [_log(message="données 東京 \ud83d\ude00", logger="é", attrs={"clé": "valeur ü"})]
    body = json.dumps({"v": 1, "source": "s", "seq": 1, "records": records}).encode()
    assert wire.decode_batch(body, NOW).records[0]["message"] == "données 東京 😀"


def test_an_unknown_field_named_with_a_lone_surrogate_can_be_answered() -> None:
    """The 422 repeats the unknown field's name: it must encode as UTF-8 (the collector's JSON
    answer), so the name comes back escaped."""
    error = _refused(_body([_log(), _log(**{"colour-\udcff": 1})]))
    assert (error.record, error.field) == (1, "colour-\\udcff")
    json.dumps(error.as_dict(), ensure_ascii=False).encode("utf-8")
    envelope_error = _refused(_body([_log()], **{"extra-\udcff": 1}))
    assert (envelope_error.record, envelope_error.field) == (None, "extra-\\udcff")


def test_json_nested_deeper_than_the_parser_takes_is_a_wire_error() -> None:
    """The standard library's parser raises RecursionError for 5000 nested lists: a WireError of
    the envelope (record and field None, which the collector answers 400), never a RecursionError."""
    deep = b"[" * 5000 + b"]" * 5000
    body = b'{"v": 1, "source": "s", "seq": 1, "records": [' + deep + b"]}"
    error = _refused(body)
    assert (error.record, error.field, error.message) == (None, None, "body is not valid JSON: nested too deeply")


def test_json_nested_too_deeply_for_orjson_falls_back_to_a_wire_error() -> None:
    """The collector parses with orjson and falls back to the standard library on what orjson
    refuses (its own nesting limit is 1024): the fallback's RecursionError is caught too."""
    orjson = pytest.importorskip("orjson")

    def parse_like_the_collector(raw: bytes) -> Any:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return wire.loads_batch(raw)

    body = b'{"v": 1, "source": "s", "seq": 1, "records": [' + b"{\"a\":" * 3000 + b"1" + b"}" * 3000 + b"]}"
    with pytest.raises(WireError) as caught:
        wire.decode_batch(body, NOW, loads=parse_like_the_collector)
    assert (caught.value.record, caught.value.field) == (None, None)


def test_a_json_field_may_nest_16_containers_not_17() -> None:
    ok: Any = "leaf"
    for _ in range(wire.MAX_JSON_DEPTH):
        ok = [ok]
    wire.validate_record(_log(attrs=ok), 0, NOW)
    with pytest.raises(WireError) as caught:
        wire.validate_record(_log(attrs=[ok]), 0, NOW)
    assert (caught.value.field, caught.value.message) == ("attrs", "JSON nested too deeply")


def test_the_json_walker_stops_at_its_depth_whatever_it_is_given() -> None:
    """A value built in Python (no parser in front) nested 100 000 deep: the walker refuses it
    after 16 levels instead of recursing into it."""
    value: Any = 1
    for _ in range(100_000):
        value = [value]
    with pytest.raises(WireError) as caught:
        wire.validate_record(_log(attrs={"deep": value}), 3, NOW)
    assert (caught.value.record, caught.value.field, caught.value.message) == (3, "attrs", "JSON nested too deeply")


@pytest.mark.parametrize("kind", [{}, [], 3, None, "nope"])
def test_a_kind_that_is_not_a_known_string_is_refused(kind: object) -> None:
    """Found by schemathesis: ``"kind": {}`` raised TypeError (unhashable) and the collector said 500."""
    with pytest.raises(WireError) as caught:
        wire.validate_record({"kind": kind, "job": "1", "ts": NOW}, 2, NOW)
    assert (caught.value.record, caught.value.field) == (2, "kind")
