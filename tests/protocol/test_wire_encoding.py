"""``encode_batch`` gives the standard library's verdict whether or not orjson is installed:
the same JSON values on the wire, and the same ``ValueError``/``TypeError`` for what JSON
cannot hold (the shipper drops the records that raise, one by one)."""

from __future__ import annotations

import dataclasses
import datetime
import gzip
import json
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobsight.protocol import wire

pytest.importorskip("orjson", reason="orjson (the agent extra) is what this compares with the standard library")

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(), st.just(float("nan")), st.just(float("inf")), st.just(-float("inf")),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)),
    max_leaves=12,
)
RECORDS = st.lists(st.dictionaries(st.sampled_from(["kind", "job", "ts", "util_gpu", "attrs", "x"]), VALUES),
                   max_size=6)


@dataclasses.dataclass
class Point:
    x: float


class Level(int):
    pass


# What the standard library refuses or renders its own way, deep inside a record too.
AWKWARD: list[Any] = [
    float("nan"), [1.0, [float("-inf")]], {"deep": {"er": float("inf")}}, 2**64, -(2**63) - 1,
    datetime.datetime(2026, 1, 1), Point(1.0), OrderedDict(a=float("nan")), OrderedDict(a=1), Level(3),
    {1: "int key"}, (1.5, 2.5), "\udcff",
]


def _stdlib(records: list[Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as patch:
        patch.setattr(wire, "_orjson", None)
        return _verdict(records)


def _verdict(records: list[Any]) -> Any:
    try:
        body = wire.encode_batch("s", 1, records)
    except (TypeError, ValueError) as exc:
        return type(exc).__name__
    envelope = json.loads(gzip.decompress(body))
    return envelope["records"]


@settings(max_examples=300, deadline=None)
@given(records=RECORDS)
def test_any_records_encode_as_the_standard_library_encodes_them(records: list[Any]) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        expected = _stdlib(records, monkeypatch)
    got = _verdict(records)
    # NaN != NaN: compare the JSON text the verdicts would give.
    assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)


@pytest.mark.parametrize("value", AWKWARD, ids=repr)
def test_awkward_values_get_the_standard_librarys_verdict(value: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    records = [{"kind": "log", "job": "1", "ts": 1, "attrs": value}, {"kind": "log", "job": "1", "ts": 2}]
    expected = _stdlib(records, monkeypatch)
    assert json.dumps(_verdict(records), sort_keys=True) == json.dumps(expected, sort_keys=True)


def test_plain_batches_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node daemon's batch never reaches the standard library when orjson is there."""
    def refuse(*args: Any, **kwargs: Any) -> str:
        raise AssertionError("json.dumps was called")

    monkeypatch.setattr(wire.json, "dumps", refuse)
    record = {"kind": "gpu_sample", "job": "1", "ts": 1, "util_gpu": 97.5, "mig_uuid": None, "lost": False}
    assert json.loads(gzip.decompress(wire.encode_batch("s", 1, [record] * 80)))["records"] == [record] * 80


def test_the_wire_works_where_orjson_is_not_installed() -> None:
    """A node with the standard library only: importing orjson fails, batches still encode."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['orjson'] = None\n"  # `import orjson` now raises ImportError
        "import gzip, json\n"
        "from jobsight.protocol import wire\n"
        "assert wire._orjson is None\n"
        "body = wire.encode_batch('s', 1, [{'kind': 'log', 'job': '1', 'ts': 1, 'v': 0.5}])\n"
        "print(json.loads(gzip.decompress(body))['records'][0]['v'])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0.5"
