"""The column-at-a-time check of a batch's records gives the verdict the record-by-record
check gives: the same records accepted, the same first error (record, field, message) raised."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobsight.protocol import wire
from jobsight.protocol.wire import WireError, now_us

NOW = now_us()

GPU = {"kind": "gpu_sample", "job": "7", "ts": NOW - 5_000_000, "node": "n1", "gpu_index": 0, "gpu_uuid": "GPU-a",
       "gpu_name": "H100", "mig_uuid": None, "util_gpu": 97.0, "util_mem": 40.0, "mem_used": 2**36,
       "mem_total": 2**37, "power_w": 612.5, "energy_j": 1.5e6, "temp_c": 61.0, "sm_clock_mhz": 1980,
       "pcie_tx_kbs": 1000, "throttle_reasons": 0, "process_count": 1, "sm_active": 71.2, "lost": False}
HOST = {"kind": "host_sample", "job": "7", "ts": NOW - 5_000_000, "node": "n1", "cpu_util": 640.0,
        "mem_used": 2**34}
STEP = {"kind": "step", "job": "7", "ts": NOW - 1_000_000, "rank": 3, "step": 10, "duration_s": 0.25,
        "data_wait_s": 0.01, "epoch": 1}
LOG = {"kind": "log", "job": "7", "ts": NOW - 1_000_000, "level": "INFO", "message": "épochs ✓", "rank": 0}
TEMPLATES = [GPU, HOST, STEP, LOG]

# Values that sit on, just past or far past a rule: types, bounds, NaN, huge ints, strings.
ODD_VALUES: list[Any] = [
    None, True, False, 0, -1, 1, 2**15, 2**31, -(2**31) - 1, 2**63, 10**400, 0.0, -0.0, 100.0, 100.0001, -1e-9,
    1e140, 1e141, float("nan"), float("inf"), -float("inf"), "", "x", "a\x00b", "\udcff", "é" * 5000,
    "x" * 300, [], {}, [1], NOW, NOW + 2 * 86_400_000_000, NOW - 8 * 86_400_000_000, 946_684_800_000_000,
]


@st.composite
def batches(draw: st.DrawFn) -> list[Any]:
    records: list[Any] = []
    for _ in range(draw(st.integers(1, 12))):
        record: Any = dict(draw(st.sampled_from(TEMPLATES)))
        for _ in range(draw(st.integers(0, 2))):
            field = draw(st.sampled_from([*record, "unknown_field", "kind"]))
            record[field] = draw(st.sampled_from(ODD_VALUES))
        if draw(st.integers(0, 40)) == 0:
            record = draw(st.sampled_from([None, [], "record", 5]))
        records.append(record)
    return records


def _verdict(check: Any) -> tuple[str, Any]:
    try:
        return "ok", check()
    except WireError as exc:
        return "refused", (exc.record, exc.field, exc.message)


@settings(max_examples=600, deadline=None)
@given(batches())
def test_columns_and_records_agree(records: list[Any]) -> None:
    by_record = _verdict(lambda: [wire.validate_record(r, i, NOW) for i, r in enumerate(records)])
    by_column = _verdict(lambda: wire.validate_records(records, NOW))
    assert by_column == by_record


@pytest.mark.parametrize(("field", "value"), [
    ("util_gpu", float("nan")), ("util_gpu", 100.5), ("power_w", 10**400), ("gpu_index", 2**15),
    ("gpu_uuid", "a\x00b"), ("gpu_name", "\udcff"), ("lost", 1), ("mem_used", 1.5), ("job", ""),
    ("ts", NOW + 2 * 86_400_000_000),
])
def test_a_bad_value_in_the_middle_of_a_node_batch_is_named(field: str, value: Any) -> None:
    records = [dict(GPU, gpu_index=i % 8) for i in range(80)]
    records[41][field] = value
    with pytest.raises(WireError) as caught:
        wire.validate_records(records, NOW)
    assert (caught.value.record, caught.value.field) == (41, field)
