"""One straggler rule: the job page's banner and ``/diagnosis`` name the same ranks."""

from __future__ import annotations

import pandas as pd
import pytest

from jobsight.collector.query.rank_outliers import find_stragglers
from jobsight.protocol.diagnosis import DEFAULT_THRESHOLDS, diagnose, stragglers


def _steps(step_time_by_rank: dict[int, float], n: int = 20) -> list[dict[str, float | int]]:
    return [{"rank": rank, "duration_s": value, "data_wait_s": 0.0} for rank, value in step_time_by_rank.items()
            for _ in range(n)]


def _buckets(step_time_by_rank: dict[int, float]) -> pd.DataFrame:
    """What the query layer gives the job page: per rank and bucket, mean step time and count."""
    return pd.DataFrame([{"rank": rank, "bucket": b, "duration_s": value, "steps": 10}
                         for rank, value in step_time_by_rank.items() for b in range(3)])


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        ({0: 0.50, 1: 0.50, 2: 0.50, 3: 0.60}, []),  # 1.2x: over the page's old 15 %, under the rule
        ({0: 0.50, 1: 0.50, 2: 0.50, 3: 1.00}, [3]),
        ({0: 0.50, 1: 0.90}, [1]),
        ({0: 0.001, 1: 0.0015}, []),  # 1.5x, but half a millisecond is noise
        ({0: 0.5}, []),
    ],
)
def test_page_and_diagnosis_agree(times: dict[int, float], expected: list[int]) -> None:
    assert stragglers(times) == expected
    assert find_stragglers(_buckets(times)) == expected
    hints = {hint["rule"]: hint for hint in diagnose(steps=_steps(times))}
    if expected:
        assert hints["straggler"]["evidence"]["rank"] == expected[0]
        assert hints["straggler"]["evidence"]["stragglers"] == expected
    else:
        assert "straggler" not in hints


def test_thresholds_are_the_rule_s_own() -> None:
    ratio = DEFAULT_THRESHOLDS.straggler_ratio
    just_over = {0: 1.0, 1: 1.0, 2: 1.0, 3: ratio + 0.01}
    just_under = {0: 1.0, 1: 1.0, 2: 1.0, 3: ratio - 0.01}
    assert stragglers(just_over) == [3] and stragglers(just_under) == []


def test_in_synchronous_training_all_three_compare_own_work() -> None:
    """Every rank's step takes 0.5 s (the fast ones wait in the all-reduce); rank 2's data wait +
    forward is twice the others'. The page, ``/diagnosis`` and the live health rule name rank 2."""
    from jobsight.rules.health import HealthThresholds, JobHealthInput, RankSteps, evaluate

    own = {0: 0.20, 1: 0.21, 2: 0.42}
    buckets = pd.DataFrame([{"rank": r, "bucket": b, "duration_s": 0.5, "own_s": v, "steps": 10}
                            for r, v in own.items() for b in range(3)])
    assert find_stragglers(buckets) == [2]
    assert find_stragglers(buckets.drop(columns="own_s")) == []  # step times alone name nobody
    steps = [{"rank": r, "duration_s": 0.5, "data_wait_s": 0.0, "forward_s": v} for r, v in own.items()
             for _ in range(20)]
    assert diagnose(steps=steps)[0]["evidence"]["stragglers"] == [2]
    ranks = [RankSteps(r, 1e9, 0.5, 100, 0.5, v) for r, v in own.items()]
    assert [f.rank for f in evaluate(JobHealthInput("j", 1e9, True, ranks), HealthThresholds())] == [2]
