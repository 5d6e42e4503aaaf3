"""Neighbouring time buckets merged, so that a chart's series fit a point budget (:func:`merge_buckets`).

On the frames the dashboard builds from the grids' rows (:mod:`jobsight.collector.query.grids`), with
pandas: the dashboard's (its extra installs pandas); the collector's own processes never import it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pandas as pd


def merge_buckets(frame: pd.DataFrame, by: Sequence[str], most: int, how: Mapping[str, str]) -> pd.DataFrame:
    """``frame`` (series named by ``by`` over one shared grid of buckets) with runs of
    neighbouring buckets merged, so that no series has more than ``most``; each merged bucket
    takes its first bucket's time and the columns of ``how`` aggregated as it says."""
    buckets = frame["bucket"].drop_duplicates().sort_values().reset_index(drop=True)
    if len(buckets) <= most:
        return frame
    factor = math.ceil(len(buckets) / most)
    first = buckets.groupby(buckets.index // factor).transform("first")
    merged = frame.assign(bucket=frame["bucket"].map(dict(zip(buckets, first, strict=True))))
    return merged.groupby([*by, "bucket"], as_index=False, sort=True, dropna=False).agg(dict(how))
