"""A batch cannot make the collector create partitions by the hundred.

Time-series rows go to daily partitions, created on demand for a day that has none. Records
up to ``MAX_RECORD_AGE_DAYS`` old are taken (a spool replayed after an outage); older ones,
and a batch whose records fall on more than ``MAX_BATCH_DAYS`` UTC days, are refused.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from jobsight.protocol import wire
from jobsight.protocol.wire import WireError

# Noon UTC: the window a record may fall in (7 days back, 1 ahead) then touches 9 UTC days.
NOON = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
NOW = int(NOON.timestamp()) * 1_000_000
HOUR = 3600 * 1_000_000
DAY = 24 * HOUR


def _metric(ts: int) -> dict[str, Any]:
    return {"kind": "metric", "job": "1", "ts": ts, "name": "loss", "value": 1.0}


def _body(records: list[dict[str, Any]]) -> bytes:
    return json.dumps({"v": 1, "source": "s", "seq": 1, "records": records}).encode()


def test_a_record_older_than_seven_days_is_refused_by_index_and_ts() -> None:
    assert wire.MAX_RECORD_AGE_DAYS == 7
    late = NOW - 7 * DAY + HOUR  # an outage of almost a week, replayed: taken
    assert wire.decode_batch(_body([_metric(late)]), NOW).records[0]["ts"] == late
    with pytest.raises(WireError) as caught:
        wire.decode_batch(_body([_metric(NOW), _metric(NOW - 7 * DAY - HOUR)]), NOW)
    assert (caught.value.record, caught.value.field) == (1, "ts")
    assert caught.value.message.startswith("older than 7 days: ")


def test_a_timestamp_in_the_wrong_unit_still_says_so() -> None:
    for ts in (NOW // 1000, NOW * 1000):  # milliseconds, nanoseconds
        with pytest.raises(WireError) as caught:
            wire.validate_record(_metric(ts), 0, NOW)
        assert caught.value.message == "timestamp out of range (expects microseconds since the epoch)"


def _one_per_day(days: int) -> list[dict[str, Any]]:
    """Records on ``days`` different UTC days, each of them inside the window a record may be in:
    the first a little under 7 days old, then one an hour into each following day."""
    midnight = NOW - 12 * HOUR
    records = [_metric(NOW - 7 * DAY + HOUR)]
    records += [_metric(midnight - 6 * DAY + n * DAY + HOUR) for n in range(days - 1)]
    assert len({dt.datetime.fromtimestamp(r["ts"] / 1e6, dt.UTC).date() for r in records}) == days
    return records


def test_a_batch_on_eight_days_is_taken() -> None:
    assert wire.MAX_BATCH_DAYS == 8
    assert len(wire.decode_batch(_body(_one_per_day(8)), NOW).records) == 8


def test_a_batch_spread_over_more_than_eight_days_is_refused_at_the_envelope() -> None:
    """Nine records, each valid alone (the ninth is 1 day ahead, inside the future slack)."""
    records = _one_per_day(9)
    for index, record in enumerate(records):
        wire.validate_record(record, index, NOW)
    with pytest.raises(WireError) as caught:
        wire.decode_batch(_body(records), NOW)
    assert (caught.value.record, caught.value.field) == (None, "records")
    assert caught.value.message.startswith("records on 9 different UTC days: at most 8 in one batch")


def test_many_records_of_one_day_are_one_day() -> None:
    records = [_metric(NOW - n * 1_000_000) for n in range(2000)]
    assert len(wire.decode_batch(_body(records), NOW).records) == 2000
