"""One json_safe for log attributes and run metadata: whatever it gets, the wire takes it."""

from __future__ import annotations

import json
import math
import os

from jobsight.protocol import wire
from jobsight.protocol.json_safe import MAX_DEPTH, MAX_ITEMS, MAX_REPR, clip, json_safe


class _BrokenRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no")


def test_values_the_wire_refuses_become_strings() -> None:
    assert json_safe({"nan": math.nan, "inf": -math.inf, "big": 2**70, "ok": 3}) == {
        "nan": "nan", "inf": "-inf", "big": str(2**70), "ok": 3,
    }
    assert json_safe(_BrokenRepr()) == "<unrepresentable _BrokenRepr>"
    assert json_safe(object()).startswith("<object object")


def test_caps_on_depth_items_strings_and_keys() -> None:
    deep: object = "leaf"
    for _ in range(MAX_DEPTH + 3):
        deep = [deep]
    made = json_safe({"deep": deep, "many": list(range(MAX_ITEMS + 50)), "long": "x" * (wire.MAX_MESSAGE + 10),
                      "k" * (wire.MAX_STRING + 5): 1, "nul": "a\x00b", "obj": "y" * 10})
    assert len(made["many"]) == MAX_ITEMS
    assert len(made["long"]) == wire.MAX_MESSAGE
    assert made["nul"] == "a\\0b"
    assert all(len(key) <= wire.MAX_STRING for key in made)
    assert len(clip(repr(list(range(10_000))), MAX_REPR)) == MAX_REPR
    # What comes out validates as a record's JSON field.
    record = {"kind": "log", "job": "j", "ts": wire.now_us(), "level": "INFO", "message": "m", "attrs": made}
    wire.validate_record(json.loads(json.dumps(record, allow_nan=False)), 0)


def test_lone_surrogates_become_escapes_the_wire_takes() -> None:
    """A file name that is not UTF-8 reaches Python as a lone surrogate (os.fsdecode); the
    collector refuses those, so clip (and json_safe, keys included) writes them out."""
    name = os.fsdecode(b"data-\xff.bin")
    assert name == "data-\udcff.bin"
    assert clip(name, 100) == "data-\\xff.bin"
    assert clip("a\ud800b é", 100) == "a\\ud800b é"  # not an escaped byte: its own escape
    assert clip("données", 100) == "données"
    made = json_safe({name: [name, {"k\udcfe": "\ud800"}]})
    assert made == {"data-\\xff.bin": ["data-\\xff.bin", {"k\\xfe": "\\ud800"}]}
    record = {"kind": "log", "job": "j", "ts": wire.now_us(), "level": "INFO", "message": clip(name, 100),
              "attrs": made}
    wire.validate_record(json.loads(json.dumps(record)), 0)


def test_clip_cuts_after_escaping_and_can_keep_the_end() -> None:
    escaped = clip("\udcff" * 10, 12)  # each becomes 4 characters: the cut comes after
    assert len(escaped) == 12 and escaped.endswith("…") and "\udcff" not in escaped
    assert clip("Traceback ... ValueError: boom", 17, tail=True) == "…ValueError: boom"
