"""A page's table as a CSV download: a clean export for a spreadsheet or a script, by the rules of
:mod:`jobsight.rules.display_text` where a file for machines reads the same as the page.

- Headers: the words the page's table shows (its column settings' labels, else
  :func:`display_text.column_label`), never a snake_case name.
- An unknown value is an empty cell: never "None", "nan" or "NaT" (nor the page's "-" or "unknown",
  which a spreadsheet would read as text).
- Times are ISO 8601 in UTC with ``Z`` (``2024-03-04T10:00:00Z``); a day column (``day``) is the
  ISO date (``2024-03-04``), never ``2024-03-04 00:00:00+00:00``.
- A ``state`` is as Slurm names it (``TIMEOUT``); numbers are plain numbers at full precision (no
  "≥", no unit, no rounding: the page rounds, the file does not); a list is its items joined by ``;``.
- A text cell that a spreadsheet would run as a formula (it starts with ``=``, ``+``, ``-``, ``@``, a tab
  or a carriage return: a job's name is its owner's to choose) is quoted with a leading ``'``.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import numbers
from collections.abc import Collection, Mapping
from typing import Any, Final

import numpy as np
import pandas as pd

from jobsight.rules import display_text

DAY_COLUMNS: Final = frozenset({"day"})
"""Columns whose times are whole UTC days (the audit's trend)."""
FORMULA_START: Final = ("=", "+", "-", "@", "\t", "\r")
"""What a spreadsheet reads as the start of a formula (OWASP's list for CSV injection)."""


def labels(frame: pd.DataFrame, column_config: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Each shown column's header as the page's table heads it: the label of its column setting
    (``st.column_config.NumberColumn("GPU-hours")`` or a plain string), else its name in words. A
    column the page hides (its setting ``None``) is left out."""
    shown: dict[str, str] = {}
    for name in map(str, frame.columns):
        setting = (column_config or {}).get(name, "")
        if setting is None:
            continue
        label = setting if isinstance(setting, str) else setting.get("label") if isinstance(setting, Mapping) else ""
        shown[name] = str(label or display_text.column_label(name))
    return shown


def _text(value: str) -> str:
    return "'" + value if value.startswith(FORMULA_START) else value


def cell(value: Any, *, column: str = "", day: bool = False) -> str:
    """One value as the CSV's cell (the rules above); ``column`` names a ``state`` column, ``day`` a
    column of whole days."""
    if isinstance(value, list | tuple | np.ndarray):
        return _text(";".join(cell(item) for item in value if not display_text.is_missing(item)))
    if display_text.is_missing(value):
        return ""
    if column == "state":
        return display_text.state(str(value))
    if isinstance(value, bool | np.bool_):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return repr(float(value))  # the shortest text that reads back as the same float
    if isinstance(value, dt.datetime | dt.date):
        return display_text.day(value) if day or not isinstance(value, dt.datetime) else display_text.iso_moment(value)
    if isinstance(value, dt.timedelta):
        return repr(value.total_seconds())
    if isinstance(value, Mapping):
        return _text(json.dumps(value, default=str, sort_keys=True))
    return _text(str(value))


def csv_text(frame: pd.DataFrame, *, column_config: Mapping[str, Any] | None = None,
             days: Collection[str] = DAY_COLUMNS) -> str:
    """The frame as CSV text: a header row of :func:`labels`, then a row per row of ``frame``, each
    cell by :func:`cell` (``days``: the columns of whole UTC days)."""
    heads = labels(frame, column_config)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(heads.values())
    for row in frame[list(heads)].itertuples(index=False, name=None):
        writer.writerow(cell(value, column=name, day=name in days) for name, value in zip(heads, row, strict=True))
    return out.getvalue()


def csv_bytes(frame: pd.DataFrame, *, column_config: Mapping[str, Any] | None = None,
              days: Collection[str] = DAY_COLUMNS) -> bytes:
    """:func:`csv_text` in UTF-8, for ``st.download_button``."""
    return csv_text(frame, column_config=column_config, days=days).encode()
