"""A span of time a series is read over, and the buckets it is cut into."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass


@dataclass(frozen=True)
class TimeRange:
    start: dt.datetime
    end: dt.datetime

    def bucket_seconds(self, points: int) -> float:
        """Bucket width giving at most ``points`` buckets over the range.

        ``date_bin`` aligns buckets to ``start``, so a range of ``span`` makes
        ``floor(span / width) + 1`` buckets; a width just over ``span / points``
        keeps that at ``points`` or fewer.
        """
        span_us = max(int((self.end - self.start) / dt.timedelta(microseconds=1)), 0)
        return (span_us // max(points, 1) + 1) / 1e6

    def from_minute(self) -> TimeRange:
        """The range from the start of its first minute: what the minute rollup's buckets align to."""
        return TimeRange(self.start.replace(second=0, microsecond=0), self.end)

    def from_hour(self) -> TimeRange:
        """The range from the start of its first UTC hour: what the hour rollup's buckets align
        to (in UTC: a session's zone may be half an hour off it)."""
        start = self.start.astimezone(dt.UTC) if self.start.tzinfo is not None else self.start
        return TimeRange(start.replace(minute=0, second=0, microsecond=0), self.end)
