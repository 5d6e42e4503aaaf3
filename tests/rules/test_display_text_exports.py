"""The formatter's two additions for tables and files: a number column's format that gives its
largest figure the digits :func:`display_text.figure` gives it, and a time as ISO 8601 in UTC with Z."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import pytest

from jobsight.rules import display_text as d


@pytest.mark.parametrize("values", [[2.33605, 0.5], [0.29983, None], [12345.6, 3.0], [0.0123456], [3.0, float("nan")]])
def test_a_columns_format_gives_its_largest_figure_the_metrics_digits(values: list[float | None]) -> None:
    largest = max(v for v in values if v is not None and v == v)
    assert d.figure_format(values) % largest == d.figure(largest) == d.energy(largest, unit=False)


def test_a_column_with_no_figure_or_a_huge_one_still_has_a_format() -> None:
    assert (d.figure_format([]), d.figure_format([None, 0.0]), d.figure_format([123456.7])) == ("%.0f", "%.0f", "%.1f")


def test_a_time_for_machines_is_iso_8601_utc_with_z() -> None:
    at = dt.datetime(2026, 11, 21, 1, 2, 3, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert d.iso_moment(at) == d.iso_moment(pd.Timestamp(at)) == "2026-11-21T00:02:03Z"
    assert d.iso_moment("2026-11-21 00:02:03.250000+00:00") == "2026-11-21T00:02:03.250000Z"
    assert d.iso_moment("2026-11-21T00:02:03") == "2026-11-21T00:02:03Z"  # naive: UTC, every page's clock
    assert (d.iso_moment(None), d.iso_moment(pd.NaT)) == (d.MISSING, d.MISSING)
