"""The ranks a job's step chart draws alone, and the band it draws across the others (:func:`step_view`).

Stragglers come first, by the one rule (:func:`find_stragglers`, that of
:func:`jobsight.protocol.diagnosis.stragglers`, which ``/diagnosis`` and the health rules apply), then
the ranks far outside the band across ranks by the same rule's thresholds (:func:`outside_band`), at
most :data:`MAX_OUTLIER_LINES`; everything within a chart's point budget. The dashboard's data layer
(:mod:`jobsight.dashboard.data`) returns the view and the chart only draws it.

On the frames the dashboard builds from :func:`jobsight.collector.query.grids.read_step_grid`'s rows,
with pandas: the dashboard's (its extra installs pandas); the collector's own processes never import it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from jobsight.collector.query.bucket_merge import merge_buckets
from jobsight.collector.query.grids import points_per_series
from jobsight.protocol import diagnosis


def compares_own_work(steps: pd.DataFrame) -> bool:
    """Whether :func:`find_stragglers` compares own work per step (every bucket measured it)."""
    return "own_s" in steps and bool(steps["own_s"].notna().all())


def find_stragglers(steps: pd.DataFrame) -> list[int]:
    """Straggler ranks by the one rule of :func:`jobsight.protocol.diagnosis.stragglers`, over each
    rank's mean own work per step (data wait + forward: in synchronous data-parallel training every
    rank's step time is alike) where every bucket measured it, else its mean step time, in the
    shown range: what the health rule and ``/diagnosis`` compare."""
    if steps.empty or steps["rank"].nunique() < 2:
        return []
    own = compares_own_work(steps)
    weighted = steps.assign(total=steps["own_s" if own else "duration_s"] * steps["steps"]).groupby("rank")[
        ["total", "steps"]].sum()
    per_rank = weighted["total"] / weighted["steps"]
    return sorted(diagnosis.stragglers({int(rank): float(value) for rank, value in per_rank.items()}))


BAND_FROM_RANKS = 5
"""From this many ranks the step chart is a band across ranks; up to four, a line per rank reads well."""
BAND_QUANTILES = (0.1, 0.9)
"""The band's edges: the 10th and 90th percentile of the ranks' step times in each bucket. Not the
minimum and maximum, which a single slow rank would set; those ranks are drawn as lines instead."""
MAX_OUTLIER_LINES = 8
"""Most ranks drawn alone over the band, stragglers first: more lines would be the spaghetti the
band replaces. The caption says how many more there were."""


@dataclass(frozen=True)
class StepView:
    """What the step chart draws: ``band`` (per bucket: ``low``, ``median``, ``high``, ``ranks``),
    ``None`` with fewer than :data:`BAND_FROM_RANKS` ranks; ``lines``, the per-bucket rows of the ranks
    drawn alone (every rank without a band, else ``outliers``); ``outliers``, the ranks outside the
    band in drawing order, and ``hidden``, the further outliers not drawn."""

    ranks: int
    band: pd.DataFrame | None
    lines: pd.DataFrame
    outliers: list[int]
    stragglers: list[int]
    hidden: int = 0
    own_work: bool = False
    """Whether the stragglers were found on own work per step (:func:`compares_own_work`), else on step time."""
    own_band: pd.DataFrame | None = None
    """The band of own work per step across ranks (as ``band``), where ``own_work`` and there is a band;
    the ``lines`` then carry each drawn rank's own work per step (``own_s``) too. In synchronous training
    every rank's step time is alike, so the straggler's step-time line lies on the band: its own work is
    what sets it apart."""


def _ranked(steps: pd.DataFrame) -> pd.DataFrame:
    return steps.assign(rank=steps["rank"].fillna(-1).astype(int))


def _merge_steps(steps: pd.DataFrame, most: int) -> pd.DataFrame:
    """Steps with neighbouring buckets merged to at most ``most`` per rank, weighted by step count (own
    work per step, ``own_s``, by the steps that measured it, so a merged bucket keeps it where any did)."""
    if steps["bucket"].nunique() <= most:
        return steps
    weighted = steps.assign(total=steps["duration_s"] * steps["steps"])
    how = {"total": "sum", "steps": "sum", "last_step": "max"}
    own = "own_s" in steps
    if own:
        measured = steps["own_s"].notna()
        weighted = weighted.assign(own_total=(steps["own_s"] * steps["steps"]).where(measured, 0.0),
                                   own_steps=steps["steps"].where(measured, 0))
        how |= {"own_total": "sum", "own_steps": "sum"}
    merged = merge_buckets(weighted, ["rank"], most, how)
    merged = merged.assign(duration_s=merged["total"] / merged["steps"]).drop(columns="total")
    if own:
        own_steps = merged["own_steps"].astype(float)
        merged = merged.assign(own_s=(merged["own_total"] / own_steps).where(own_steps > 0)).drop(
            columns=["own_total", "own_steps"])
    return merged


def step_band(steps: pd.DataFrame, column: str = "duration_s") -> pd.DataFrame:
    """Per bucket, across ranks, of ``column`` (step time; ``own_s`` for own work per step): ``low``/``high``
    (:data:`BAND_QUANTILES`), ``median`` and ``ranks``."""
    grouped = steps.dropna(subset=[column]).groupby("bucket")[column]
    low, high = BAND_QUANTILES
    return pd.DataFrame({"low": grouped.quantile(low), "median": grouped.median(), "high": grouped.quantile(high),
                         "ranks": grouped.count()}).reset_index()


def outside_band(steps: pd.DataFrame, band: pd.DataFrame,
                 t: diagnosis.Thresholds = diagnosis.DEFAULT_THRESHOLDS) -> list[int]:
    """Ranks far outside the band in at least one bucket, farthest first: by the straggler rule's
    own thresholds, measured from the band's edge rather than the median, so the spread the band
    already shows is never enough (at least ``straggler_ratio`` × the high edge and
    ``straggler_min_s`` over it, or as far under the low edge)."""
    rows = steps.merge(band[["bucket", "low", "high"]], on="bucket")
    value, low, high = rows["duration_s"], rows["low"], rows["high"]
    slow = (value >= t.straggler_ratio * high) & (value - high >= t.straggler_min_s)
    fast = (value * t.straggler_ratio <= low) & (low - value >= t.straggler_min_s)
    far = rows.assign(how_far=(value / high).where(slow, (low / value).where(fast)))
    worst = far.dropna(subset=["how_far"]).groupby("rank")["how_far"].max()
    return [int(rank) for rank in worst.sort_values(ascending=False, kind="stable").index]


def step_view(steps: pd.DataFrame, stragglers: list[int], budget: int) -> StepView:
    """The step chart's data within ``budget`` points: with many ranks the band across ranks and,
    drawn alone, the stragglers (:func:`find_stragglers`, the one rule) then the ranks far outside
    the band (:func:`outside_band`), at most :data:`MAX_OUTLIER_LINES`; with few ranks, every rank."""
    frame = _ranked(steps)
    ranks = frame["rank"].nunique()
    if ranks < BAND_FROM_RANKS:
        lines = _merge_steps(frame, points_per_series(budget, ranks, budget))
        return StepView(ranks, None, lines, [], list(stragglers), own_work=compares_own_work(steps))
    # Slowest stragglers first (by what the rule compared), so a cap drops the mildest; then the ranks
    # outside the band, found on the buckets as read, before any merging could average a stall away.
    own = compares_own_work(steps)
    weighted = frame.assign(total=frame["own_s" if own else "duration_s"] * frame["steps"]).groupby("rank")[
        ["total", "steps"]].sum()
    mean = (weighted["total"] / weighted["steps"]).to_dict()
    slowest = sorted(stragglers, key=lambda rank: (-mean.get(rank, 0.0), rank))
    everyone = list(dict.fromkeys([*slowest, *outside_band(frame, step_band(frame))]))
    drawn = everyone[:MAX_OUTLIER_LINES]
    # + 1: the band. The own-work chart draws as many points: its own band and the same ranks.
    frame = _merge_steps(frame, points_per_series(budget, len(drawn) + 1, budget))
    lines = frame[frame["rank"].isin(drawn)]
    return StepView(ranks, step_band(frame), lines, drawn, list(stragglers), len(everyone) - len(drawn),
                    own, step_band(frame, "own_s") if own else None)
