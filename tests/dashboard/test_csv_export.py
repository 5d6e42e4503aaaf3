"""A table as CSV (dashboard/csv_export.py), cell by cell: what a spreadsheet or a script reads back."""

from __future__ import annotations

import csv
import datetime as dt
import io

import numpy as np
import pandas as pd
import streamlit as st

from jobsight.dashboard import csv_export


def test_each_kind_of_value_is_written_for_machines() -> None:
    frame = pd.DataFrame({
        "user_name": [None, "alice"], "gpu_hours": [np.float64(4.0), 0.1 + 0.2], "jobs": [np.int64(1), 2],
        "state": ["out_of_memory", None], "day": pd.to_datetime(["2026-11-21", "2026-11-22"], utc=True),
        "start_time": [pd.Timestamp("2026-11-21 10:00:00+00:00"), pd.NaT], "flags": [["idle_gpu", "low"], None],
        "name": ["@SUM(A1)", "-x"], "energy_kwh": [float("nan"), 1e-7], "dry_run": [np.bool_(True), False],
        "wait": [dt.timedelta(seconds=1.5), None], "hidden": [1, 2],
    })
    text = csv_export.csv_text(frame, column_config={"gpu_hours": st.column_config.NumberColumn("GPU-hours"),
                                                     "day": "day (UTC)", "hidden": None})
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["user", "GPU-hours", "jobs", "state", "day (UTC)", "started", "flags", "name", "GPU kWh",
                       "dry run", "wait"]
    assert rows[1] == ["", "4.0", "1", "OUT_OF_MEMORY", "2026-11-21", "2026-11-21T10:00:00Z", "idle_gpu;low",
                       "'@SUM(A1)", "", "true", "1.5"]
    assert rows[2] == ["alice", "0.30000000000000004", "2", "", "2026-11-22", "", "", "'-x", "1e-07", "false", ""]
    assert float(rows[2][1]) == 0.1 + 0.2  # every bit of the number comes back
    assert csv_export.csv_bytes(frame) == csv_export.csv_text(frame).encode()
