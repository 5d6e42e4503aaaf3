"""The health rules on hand-made inputs: where each fires, where it must not."""

from __future__ import annotations

from jobsight.protocol.health import GpuWindow, HealthThresholds, JobHealthInput, RankSteps, evaluate

T = HealthThresholds()
NOW = 1_800_000_000.0


def ranks(*last_and_median: tuple[float, float], own: tuple[float, ...] = (), steps: float = 0.5) -> list[RankSteps]:
    return [
        RankSteps(i, NOW - ago, median, 100, steps, own[i] if own else None)
        for i, (ago, median) in enumerate(last_and_median)
    ]


def rules(job: JobHealthInput) -> list[tuple[str, str]]:
    return [(f.rule, f.subject) for f in evaluate(job, T)]


def test_a_healthy_job_has_no_finding() -> None:
    gpus = [GpuWindow(f"n1/{i}", "n1", NOW - 7200, NOW - 1, 95.0, 90.0 * 3600, 3600) for i in range(8)]
    assert rules(JobHealthInput("j", NOW, True, ranks((1, 0.5), (1, 0.5), own=(0.2, 0.21)), gpus)) == []


def test_hung_needs_both_ten_median_steps_and_the_minimum() -> None:
    # 100 s silent: 200 steps of 0.5 s, but under the 120 s minimum.
    assert rules(JobHealthInput("j", NOW, True, ranks((1, 0.5), (100, 0.5)))) == []
    assert rules(JobHealthInput("j", NOW, True, ranks((1, 0.5), (130, 0.5)))) == [("hung_rank", "rank 1")]
    # A rank of 30 s steps may be quiet for 5 min.
    assert rules(JobHealthInput("j", NOW, True, ranks((1, 30.0), (250, 30.0)))) == []


def test_every_rank_stopped_is_one_finding_for_the_job_naming_the_first() -> None:
    found = evaluate(JobHealthInput("j", NOW, True, ranks((200, 0.5), (300, 0.5), (201, 0.5))), T)
    assert [(f.rule, f.subject) for f in found] == [("hung_rank", "")]
    assert "rank 1 stopped first" in found[0].message and found[0].at == NOW - 300


def test_an_ended_job_is_never_hung() -> None:
    assert rules(JobHealthInput("j", NOW, False, ranks((900, 0.5), (900, 0.5)))) == []


def test_straggler_compares_own_work_not_the_equal_step_times() -> None:
    # Synchronous DDP: steps alike (0.5 s), rank 2's forward + data wait twice the others'.
    found = evaluate(JobHealthInput("j", NOW, True, ranks((1, 0.5), (1, 0.5), (1, 0.5), own=(0.2, 0.21, 0.45))), T)
    assert [(f.rule, f.rank) for f in found] == [("straggler", 2)]
    assert found[0].evidence["compared"] == "data_wait_s + forward_s"
    # Without forward times the step times decide, and alike step times name nobody.
    assert rules(JobHealthInput("j", NOW, True, ranks((1, 0.5), (1, 0.5), (1, 0.5)))) == []


def test_idle_and_low_utilisation_windows() -> None:
    idle = GpuWindow("n1/0", "n1", NOW - 1900, NOW - 1, 2.0, 2.0 * 1900, 1900)
    busy = GpuWindow("n1/1", "n1", NOW - 1900, NOW - 1, 80.0, 80.0 * 1900, 1900)
    assert rules(JobHealthInput("j", NOW, True, (), [idle, busy])) == [("idle_allocation", "")]
    # Idle for less than the window: not yet.
    young = GpuWindow("n1/0", "n1", NOW - 600, NOW - 1, 2.0, 2.0 * 600, 600)
    assert rules(JobHealthInput("j", NOW, True, (), [young])) == []
    # No longer sampled: not judged.
    stale = GpuWindow("n1/0", "n1", NOW - 7200, NOW - 1000, 0.0, 0.0, 3600)
    assert ("idle_allocation", "") not in rules(JobHealthInput("j", NOW, True, (), [stale]))
    low = [GpuWindow(f"n1/{i}", "n1", NOW - 4000, NOW - 1, 60.0, 20.0 * 3600, 3600) for i in range(2)]
    assert rules(JobHealthInput("j", NOW, True, (), low)) == [("low_utilisation", "")]


def test_memory_unused_is_judged_at_the_end_only() -> None:
    peaks = {"n1/0": (2 * 2**30, 80 * 2**30), "n1/1": (1 * 2**30, 80 * 2**30)}
    assert rules(JobHealthInput("j", NOW, True, memory_peaks=peaks)) == []
    assert rules(JobHealthInput("j", NOW, False, memory_peaks=peaks)) == [("memory_unused", "")]
    peaks["n1/1"] = (9 * 2**30, 80 * 2**30)
    assert rules(JobHealthInput("j", NOW, False, memory_peaks=peaks)) == []
