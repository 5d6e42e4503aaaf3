"""Numbers the database cannot hold, or could not add up, are refused by validation.

Integers are held to the column they land in (smallint, integer, bigint: declared once, on
``protocol/records.py``); floats to finite values inside their field's physical range, so that
the sums PostgreSQL keeps (the per-minute GPU rollup) and takes (chart averages) never overflow.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from jobsight.protocol import wire
from jobsight.protocol.records import RECORDS
from jobsight.protocol.wire import WireError

NOW = wire.now_us()


def _gpu(**fields: Any) -> dict[str, Any]:
    return {"kind": "gpu_sample", "job": "1", "ts": NOW, "gpu_index": 0, "gpu_uuid": "GPU-0", **fields}


def _record(kind: str, **fields: Any) -> dict[str, Any]:
    required: dict[str, dict[str, Any]] = {
        "gpu_sample": {"gpu_index": 0, "gpu_uuid": "GPU-0"},
        "host_sample": {},
        "log": {"level": "INFO", "message": "m"},
        "metric": {"name": "loss", "value": 1.0},
        "step": {"step": 1, "duration_s": 0.1},
        "profile": {"profile_id": "p", "summary": {}},
        "job_started": {},
        "job_ended": {},
        "dropped": {"count": 1},
        "gpu_event": {"gpu_index": 0, "gpu_uuid": "GPU-0", "event": "xid", "code": 79},
    }
    return {"kind": kind, "job": "1", "ts": NOW, **required[kind], **fields}


def _through_json(record: dict[str, Any]) -> dict[str, Any]:
    """The record as the collector gets it: parsed from JSON text (where 10**400 is an int)."""
    parsed: dict[str, Any] = json.loads(json.dumps(record))
    return parsed


def _refused(record: dict[str, Any]) -> WireError:
    with pytest.raises(WireError) as caught:
        wire.validate_record(_through_json(record), 4, NOW)
    return caught.value


@pytest.mark.parametrize(
    ("record", "field"),
    [
        (_gpu(util_gpu=10**400), "util_gpu"),
        (_gpu(energy_j=-(10**400)), "energy_j"),
        (_record("metric", value=10**400), "value"),
        (_record("step", duration_s=10**400), "duration_s"),
    ],
)
def test_an_integer_no_float8_holds_is_refused_in_a_float_field(record: dict[str, Any], field: str) -> None:
    error = _refused(record)
    assert (error.record, error.field, error.message) == (4, field, "number too large for a float8")


def test_metric_values_are_taken_up_to_what_a_chart_can_average() -> None:
    """A chart averages a bucket of metric values, and PostgreSQL's avg keeps their sum of
    squares: 1e140 goes, 1e200 (which overflowed the metric chart with a 500) is refused."""
    for value in (1e140, -1e140, 5e-324, 0, 2**400):
        wire.validate_record(_through_json(_record("metric", value=value)), 0, NOW)
    for value in (1e200, -(2**1000), sys.float_info.max):
        assert _refused(_record("metric", value=value)).field == "value"


@pytest.mark.parametrize(
    ("kind", "field", "inside", "outside", "span"),
    [
        ("gpu_sample", "util_gpu", 100.0, 100.5, "0..100"),
        ("gpu_sample", "util_mem", 0, -0.5, "0..100"),
        ("gpu_sample", "sm_active", 100, 1e308, "0..100"),
        ("gpu_sample", "tensor_active", 0.0, -1e-9, "0..100"),
        ("gpu_sample", "power_w", 100_000, 1e306, "0..100000"),
        ("gpu_sample", "temp_c", -273, -274.0, "-273..1000"),
        ("gpu_sample", "energy_j", 1e15, 1.1e15, "0..1e+15"),
        ("host_sample", "cpu_util", 100_000, 1e6, "0..100000"),
        ("host_sample", "cpu_time_s", 1e12, -1.0, "0..1e+12"),
        ("step", "duration_s", 1e9, 1.5e9, "0..1e+09"),
        ("step", "data_wait_s", 0, -0.001, "0..1e+09"),
        ("step", "compute_s", 3600.0, 1e300, "0..1e+09"),
    ],
)
def test_a_float_outside_its_physical_range_is_refused(
    kind: str, field: str, inside: float, outside: float, span: str
) -> None:
    wire.validate_record(_through_json(_record(kind, **{field: inside})), 0, NOW)
    error = _refused(_record(kind, **{field: outside}))
    assert (error.record, error.field, error.message) == (4, field, f"number out of range for this field ({span})")


def test_nan_and_infinity_are_still_refused_by_name() -> None:
    for raw in ("NaN", "Infinity", "-Infinity"):
        record = json.loads(f'{{"kind": "gpu_sample", "job": "1", "ts": {NOW}, "gpu_index": 0, "gpu_uuid": "G", '
                            f'"util_gpu": {raw}}}')
        with pytest.raises(WireError) as caught:
            wire.validate_record(record, 0, NOW)
        assert (caught.value.field, caught.value.message) == ("util_gpu", "NaN or Infinity")


SMALLINT = "integer out of range for its column (-32768..32767)"
INTEGER = "integer out of range for its column (-2147483648..2147483647)"
BIGINT = "integer out of range for its column (-9223372036854775808..9223372036854775807)"


@pytest.mark.parametrize(
    ("kind", "field", "largest", "message"),
    [
        ("gpu_sample", "gpu_index", 2**15 - 1, SMALLINT),
        ("gpu_sample", "sm_clock_mhz", 2**31 - 1, INTEGER),
        ("gpu_sample", "pcie_rx_kbs", 2**31 - 1, INTEGER),
        ("gpu_sample", "process_count", 2**31 - 1, INTEGER),
        ("gpu_sample", "mem_used", 2**63 - 1, BIGINT),
        ("gpu_sample", "nvlink_crc_errors", 2**63 - 1, BIGINT),
        ("gpu_sample", "pcie_replays", 2**63 - 1, BIGINT),
        ("gpu_event", "gpu_index", 2**15 - 1, SMALLINT),
        ("gpu_event", "code", 2**63 - 1, BIGINT),
        ("job_started", "uid", 2**31 - 1, INTEGER),
        ("job_started", "time_limit_s", 2**31 - 1, INTEGER),
        ("job_ended", "exit_code", 2**31 - 1, INTEGER),
        ("log", "pid", 2**31 - 1, INTEGER),
        ("log", "tid", 2**63 - 1, BIGINT),
        ("step", "samples", 2**31 - 1, INTEGER),
        ("step", "epoch", 2**31 - 1, INTEGER),
        ("step", "step", 2**63 - 1, BIGINT),
        ("profile", "pid", 2**31 - 1, INTEGER),
    ],
)
def test_an_integer_is_held_to_its_column(kind: str, field: str, largest: int, message: str) -> None:
    wire.validate_record(_through_json(_record(kind, **{field: largest})), 0, NOW)
    wire.validate_record(_through_json(_record(kind, **{field: -largest - 1})), 0, NOW)
    for outside in (largest + 1, -largest - 2, 10**400):
        error = _refused(_record(kind, **{field: outside}))
        assert (error.record, error.field, error.message) == (4, field, message)


@pytest.mark.parametrize("kind", ["log", "metric", "step", "profile"])
def test_a_rank_is_never_negative(kind: str) -> None:
    """-1 keys "no rank" in the step rollup, so no process may claim it (or any negative rank)."""
    wire.validate_record(_through_json(_record(kind, rank=0)), 0, NOW)
    wire.validate_record(_through_json(_record(kind, rank=2**31 - 1)), 0, NOW)
    for outside in (-1, -(2**31), 2**31):
        error = _refused(_record(kind, rank=outside))
        assert (error.field, error.message) == ("rank", "integer out of range for its column (0..2147483647)")


def test_gpu_index_beyond_a_smallint_is_refused_before_the_rollup() -> None:
    """The case of the issue: 70000 passed (int8) and then failed the smallint COPY with a 500."""
    error = _refused(_gpu(gpu_index=70000))
    assert (error.field, error.message) == ("gpu_index", SMALLINT)


# Float fields PostgreSQL never adds up, with why: only they may take any finite number.
NOT_SUMMED: dict[tuple[str, str], str] = {}


def test_every_float_field_that_may_be_summed_has_physical_bounds() -> None:
    """No sum of stored values can overflow a float8: a million batches of MAX_RECORDS records,
    each at its field's bound, add up to a finite number. A new float field needs a Range
    (protocol/records.py) or a line in NOT_SUMMED saying why it needs none."""
    float_fields = [
        (kind, name) for kind in RECORDS for name, spec in wire.FIELDS[kind].items() if spec.rstrip("?") == "float"
    ]
    assert ("gpu_sample", "util_gpu") in float_fields
    for kind, name in float_fields:
        if (kind, name) in NOT_SUMMED:
            continue
        bounds = wire.RANGES[kind][name]
        largest = max(abs(bounds.lo), abs(bounds.hi))
        assert largest * wire.MAX_RECORDS * 1e6 < sys.float_info.max / 1e100, (kind, name, bounds)
        # avg() and stddev() keep the sum of squares of what they read.
        assert largest**2 * wire.MAX_RECORDS * 1e6 < sys.float_info.max, (kind, name, bounds)


def test_an_envelope_sent_at_no_float_holds_is_refused() -> None:
    body = json.dumps({"v": 1, "source": "s", "seq": 1, "sent_at": 10**400, "records": []}).encode()
    with pytest.raises(WireError) as caught:
        wire.decode_batch(body, NOW)
    assert (caught.value.record, caught.value.field) == (None, "sent_at")
