"""Record times on the ingest path: microseconds since the epoch (the wire's unit) and the
``timestamptz`` values and day/minute keys derived from them.

Keys (the day of a partition, the minute of the GPU rollup) are computed on the integers,
which costs far less per record than calling ``datetime`` methods; only the rows and the
few keys that are written become ``datetime`` objects.
"""

from __future__ import annotations

import datetime as dt
from typing import Final

EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
EPOCH_DAY: Final = EPOCH.date()
MINUTE_US: Final = 60 * 1_000_000
DAY_US: Final = 86400 * 1_000_000
_timedelta: Final = dt.timedelta


def ts_from_us(us: int) -> dt.datetime:
    """A UTC ``datetime`` exact to the microsecond (a float of seconds would round)."""
    return EPOCH + _timedelta(0, 0, us)


def day_of_us(us: int) -> dt.date:
    return EPOCH_DAY + _timedelta(us // DAY_US)


def days_of_us(values: list[int]) -> set[dt.date]:
    """The UTC days of many times, converting each distinct day once."""
    return {day_of_us(day * DAY_US) for day in {us // DAY_US for us in values}}
