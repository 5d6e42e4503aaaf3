"""A GPU series read a row a GPU (:func:`jobsight.collector.query.series.gpu_series_by_gpu`) as the frame the
pages draw: a row a GPU and bucket, built a column at a time.

A 64-GPU job's recent window is 8,000 buckets. Fetched as 8,000 rows, each value became a Python object
and the frame was built from them one at a time (about 30 ms of a page load, docs/scale.md); as 64 rows of
arrays, each column is one NumPy array.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any, Final

import numpy as np
import pandas as pd

from jobsight.collector.query.series import GpuMeasures

KEY: Final = ("node", "gpu_index", "bucket", "bucket_s", "interval_s")
"""The columns every GPU frame has, before its measures."""


def frame(gpus: Sequence[dict[str, Any]], measures: GpuMeasures) -> pd.DataFrame:
    """A row a GPU and bucket, in the order of ``gpus`` and their buckets: :data:`KEY` and ``measures``
    (floats; ``NaN`` where a bucket had no value). No GPUs: an empty frame with those columns."""
    columns = [*KEY, *measures]
    if not gpus:
        return pd.DataFrame(columns=columns)
    counts = np.fromiter((len(g["bucket_us"]) for g in gpus), dtype=np.int64, count=len(gpus))
    total = int(counts.sum())
    starts = np.fromiter(chain.from_iterable(g["bucket_us"] for g in gpus), dtype=np.int64, count=total)
    built: dict[str, Any] = {
        "node": np.repeat(np.array([g["node"] for g in gpus], dtype=object), counts),
        "gpu_index": np.repeat(np.array([g["gpu_index"] for g in gpus], dtype=np.int64), counts),
        "bucket": pd.to_datetime(starts, unit="us", utc=True),
        "bucket_s": np.repeat(_floats([g["bucket_s"] for g in gpus]), counts),
        "interval_s": np.repeat(_floats([g["interval_s"] for g in gpus]), counts),
    }
    for measure in measures:
        built[measure] = _floats(list(chain.from_iterable(g[measure] for g in gpus)))
    return pd.DataFrame(built, columns=columns)


def _floats(values: list[Any]) -> np.ndarray[Any, np.dtype[np.float64]]:
    """``values`` as floats, ``None`` (SQL NULL) as ``NaN``."""
    return np.array(values, dtype=np.float64)
