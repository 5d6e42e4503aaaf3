"""docs/format/packed.md's worked example is what the code packs: its input, packed by the real
compaction pass, gives the block, timeline and dictionary rows the doc shows, byte for byte; a
reader written from the doc alone (:func:`read_block`, no SQL) gives the input back, as the
collector's own reader does.

When the format changes on purpose, the failure prints each block of the doc as the code now packs
it (``packed=<name>``): paste it over the old one and explain the change in the doc.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from jobsight.collector.store import packed_params as params
from jobsight.collector.store.embedded_db import EmbeddedPostgres
from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.store.schema import Byte, gpu_sample_blocks, gpu_sample_timelines
from jobsight.collector.tiers import compaction
from jobsight.collector.tiers import reads as tiers
from tests.conftest import REPO, own_database

DOC = REPO / "docs" / "format" / "packed.md"
FENCE = re.compile(r"^```[a-z]* packed=([a-z_]+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
JOB, CLUSTER = "4242", "default"
SHOWN = ("util_gpu", "util_mem", "mem_used", "power_w", "energy_j", "temp_c", "sm_active")
"""The columns the doc walks through, in its order (each a case of the format)."""


def doc_blocks() -> dict[str, str]:
    """The doc's fenced blocks tagged ``packed=<name>``, by name."""
    return {name: body for name, body in FENCE.findall(DOC.read_text(encoding="utf-8"))}


def example_input() -> list[dict[str, Any]]:
    """The samples of the doc's example (one GPU, a few ticks of one hour), ``ts`` parsed."""
    samples: list[dict[str, Any]] = json.loads(doc_blocks()["input"])
    return [{**s, "ts": dt.datetime.fromisoformat(s["ts"])} for s in samples]


@pytest.fixture(scope="module")
def packed(postgres: EmbeddedPostgres) -> Iterator[dict[str, Any]]:
    """The example input packed by the real compaction pass: the block's, timeline's and device's rows
    (``"char"`` planes as their signed values), and the samples as the collector reads them back."""
    samples = example_input()
    day = samples[0]["ts"].date()
    for url in own_database(postgres, "packed_doc"):
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
            PartitionKeeper().ensure(conn, "gpu_samples", [day])
            for sample in samples:
                columns = ["cluster", "job_id", *sample]
                conn.execute(f"INSERT INTO gpu_samples ({', '.join(columns)}) "
                             f"VALUES ({', '.join(['%s'] * len(columns))})", [CLUSTER, JOB, *sample.values()])
            compaction.run_pass(conn, PartitionKeeper(), older_than=dt.timedelta(0), packed_retention_days=0)
            yield {
                "block": _row(conn, gpu_sample_blocks.columns, "gpu_sample_blocks"),
                "timeline": _row(conn, gpu_sample_timelines.columns, "gpu_sample_timelines"),
                "device": conn.execute("SELECT * FROM gpu_devices").fetchone(),
                "read": conn.execute(f"SELECT * FROM {tiers.samples(list(SHOWN))} s ORDER BY ts",
                                     {"job": JOB, "cluster": CLUSTER}).fetchall(),
            }


def _row(conn: psycopg.Connection[Any], columns: Any, table: str) -> dict[str, Any]:
    """The job's one row of ``table``, a ``"char"[]`` as int4[] (its signed values, -128..127)."""
    selected = [f"{c.name}::int4[] AS {c.name}" if isinstance(getattr(c.type, "item_type", None), Byte) else c.name
                for c in columns]
    row = conn.execute(f"SELECT {', '.join(selected)} FROM {table} WHERE job_id = %s", (JOB,)).fetchone()
    assert row is not None
    return dict(row)


# --- A reader written from docs/format/packed.md alone -------------------------------------------------------


def _signed(value: int, bits: int) -> int:
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


def _plane_bytes(block: dict[str, Any], prefix: str, planes: int, i: int) -> int | None:
    """Sample ``i``'s integer from the planes ``<prefix>0``..: stored ``"char"`` + 128 is byte k; a plane
    not stored is zeros; a NULL in the low plane is a NULL sample."""
    low = block[f"{prefix}0"]
    if low is None or low[i] is None:
        return None
    return sum((block[f"{prefix}{k}"][i] + params.BYTE_OFFSET) << (8 * k)
               for k in range(planes) if block[f"{prefix}{k}"] is not None)


def read_integers(block: dict[str, Any], column: str) -> list[int | None]:
    """A column's integers (times its step), as the doc says to read them."""
    n, planes = block["samples"], params.PLANES[column]
    base, step, first = block[f"{column}_base"], block.get(f"{column}_step") or 1, block.get(f"{column}_first")
    if base is None:
        return [None] * n
    if first is not None:  # a counter: the first value plus the running sum of int4 differences
        total, values = first, []
        for i in range(n):
            total += _signed(_plane_bytes(block, f"{column}_p", params.DIFFERENCE_PLANES, i) or 0, 32)
            values.append(total * step)
        return values
    if block[f"{column}_p0"] is None:  # one value throughout
        return [base * step] * n
    values = []
    for i in range(n):
        x = _plane_bytes(block, f"{column}_p", planes, i)
        values.append(None if x is None else (base ^ _signed(x, 8 * planes)) * step)
    return values


def read_block(block: dict[str, Any], column: str) -> list[Any]:
    """A column's values: its floats where the block kept them, else its integers over its scale."""
    floats = block.get(f"{column}_f")
    if floats is not None:
        return list(floats)
    scale = params.SCALES[column].scale if column in params.SCALES else 1
    return [None if v is None else v / scale for v in read_integers(block, column)]


def read_times(hour: dt.datetime, timeline: dict[str, Any]) -> list[dt.datetime]:
    """The samples' times: the hour plus the seconds and microseconds planes."""
    if timeline["sample_ts"] is not None:
        return list(timeline["sample_ts"])
    times = []
    for i in range(len(timeline["ts_s_p0"])):
        seconds = _plane_bytes(timeline, "ts_s_p", params.SECOND_PLANES, i) or 0
        micros = _plane_bytes(timeline, "ts_us_p", params.MICRO_PLANES, i) or 0
        times.append(hour + dt.timedelta(seconds=seconds, microseconds=micros))
    return times


# --- What the doc shows, rendered from the packed rows ----------------------------------------------------------


def _table(header: list[str], rows: list[list[Any]], none: str = "NULL") -> str:
    cells = [header, *[[none if c is None else str(c) for c in r] for r in rows]]
    widths = [max(len(r[k]) for r in cells) for k in range(len(header))]
    return "".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in cells)


def _stored(row: dict[str, Any]) -> str:
    """The row's stored (non-NULL) columns, one a line."""
    return "".join(f"{k} = {v.isoformat() if isinstance(v, dt.datetime) else v}\n"
                   for k, v in row.items() if v is not None)


def _column_walk(block: dict[str, Any], column: str, inputs: list[Any]) -> str:
    """One column, sample by sample: the value sent, the integer, the quotient by the step, what the planes
    hold (the value XOR the base, or a counter's difference), its bytes and their stored ``"char"``."""
    planes = [k for k in range(params.PLANES[column]) if block[f"{column}_p{k}"] is not None]
    step = block.get(f"{column}_step")
    counter = block.get(f"{column}_first") is not None
    rows = []
    for i, (sent, integer) in enumerate(zip(inputs, read_integers(block, column), strict=True)):
        x = _plane_bytes(block, f"{column}_p", params.PLANES[column], i) if planes else None
        quotient = [] if step is None else [None if integer is None else integer // step]
        rows.append([i, sent, integer, *quotient, x, *(None if x is None else (x >> 8 * k) & 255 for k in planes),
                     *(block[f"{column}_p{k}"][i] for k in planes)])
    held = "difference" if counter else "^ base"
    header = ["i", "sent", "integer", *(["/ step"] if step else []), held, *(f"byte{k}" for k in planes),
              *(f"p{k}" for k in planes)]
    return _table(header, rows)


def _parameters(planes: dict[str, int], scales: dict[str, params.Scale]) -> str:
    """The columns kept in byte planes: planes, integer type, scale and bound, step, counter."""
    rows = [[column, count, "int4" if count == 4 else "int8",
             scales[column].scale if column in scales else None, scales[column].bound if column in scales else None,
             "yes" if column in scales and scales[column].rounded else None, params.STEPS.get(column),
             "yes" if column in params.COUNTERS else None] for column, count in planes.items()]
    return _table(["column", "planes", "integer", "scale", "bound", "rounded", "step", "counter"], rows, none="-")


def _time_walk(timeline: dict[str, Any], inputs: list[dt.datetime]) -> str:
    """The times: offset from the hour in seconds and microseconds, and their planes."""
    stored = [p for p in params.TIME_PLANES if timeline[p] is not None]
    rows = [[i, t.time().isoformat(), int((t - t.replace(minute=0, second=0, microsecond=0)).total_seconds()),
             t.microsecond, *(timeline[p][i] for p in stored)] for i, t in enumerate(inputs)]
    return _table(["i", "time", "seconds", "micros", *stored], rows)


def rendered(packed: dict[str, Any]) -> dict[str, str]:
    """Every ``packed=<name>`` block of the doc but the input, as the code packs the input now and as
    :mod:`jobsight.collector.store.packed_params` has the format's numbers."""
    samples, block = example_input(), packed["block"]
    shown = {
        "gpu_planes": _parameters(params.PLANES, params.SCALES),
        "host_planes": _parameters(params.HOST_PLANES, params.HOST_SCALES),
        "device": _stored(dict(packed["device"])),
        "timeline": _stored(packed["timeline"]),
        "block": _stored(block),
        "time": _time_walk(packed["timeline"], [s["ts"] for s in samples]),
    }
    for column in ("util_gpu", "mem_used", "power_w", "energy_j", "sm_active"):
        shown[column] = _column_walk(block, column, [s.get(column) for s in samples])
    return shown


def test_doc_example_is_what_the_code_packs(packed: dict[str, Any]) -> None:
    in_doc = doc_blocks()
    now = rendered(packed)
    stale = {name: text for name, text in now.items() if in_doc.get(name) != text}
    assert not stale, "docs/format/packed.md differs from the code; as packed now:\n" + "\n".join(
        f"```text packed={name}\n{text}```" for name, text in stale.items())


def test_a_reader_from_the_doc_reads_the_input_back(packed: dict[str, Any]) -> None:
    samples, block, timeline = example_input(), packed["block"], packed["timeline"]
    assert read_times(block["ts"], timeline) == [s["ts"] for s in samples]
    for column in SHOWN:
        assert read_block(block, column) == [s.get(column) for s in samples], column
        assert [r[column] for r in packed["read"]] == [s.get(column) for s in samples], column
