"""The health rules on hand-made inputs: where each fires, where it must not."""

from __future__ import annotations

from jobsight.protocol.step_phases import BACKWARD, DATA, FORWARD, OPTIMIZER, STEP, PendingPhase
from jobsight.rules.health import GpuWindow, HealthThresholds, JobHealthInput, RankSteps, evaluate

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


# -- a hung job: who the others wait for, from where each rank said it is ----------------------

def at(step: int, phase: str, ago: float) -> PendingPhase:
    return PendingPhase(step, phase, NOW - ago)


def hung_ddp(*phases: PendingPhase | None, own: tuple[float, ...] = (0.2, 0.2)) -> JobHealthInput:
    """Two or more ranks of synchronous DDP, all silent for about 4 min after steps of 0.5 s, each in
    ``phases`` (``None``: it said nothing, an older agent)."""
    return JobHealthInput("j", NOW, True, [
        RankSteps(i, NOW - 240 - 0.001 * (len(phases) - i), 0.5, 100, 0.5, own[i] if i < len(own) else 0.2,
                  pending=p)
        for i, p in enumerate(phases)
    ])


def test_the_rank_still_in_its_forward_pass_is_named_not_the_one_waiting_in_the_all_reduce() -> None:
    # Rank 0's last step ended a millisecond before rank 1's ("stopped first" by the clock alone),
    # but it finished the forward pass of step 57 and waits in backward: rank 1 holds the job.
    found = evaluate(hung_ddp(at(57, BACKWARD, 239.9), at(57, FORWARD, 240)), T)
    assert [(f.rule, f.subject, f.rank) for f in found] == [("hung_rank", "", 1)]
    message = found[0].message
    assert "rank 1 is still in the forward pass of step 57 (since " in message
    assert "rank 0 is in backward of step 57, in its gradient all-reduce" in message
    assert "Check rank 1's stack" in message and "stopped first" not in message
    assert found[0].evidence["behind"] == [1] and found[0].evidence["waiting"] == [0]
    assert found[0].evidence["phases"]["1"] == {"step": 57, "phase": "forward", "since": NOW - 240}
    assert found[0].at == NOW - 240 - 0.001
    # Swapped: rank 0 is stuck, rank 1 waits.
    swapped = evaluate(hung_ddp(at(57, FORWARD, 240), at(57, BACKWARD, 239.9)), T)
    assert [(f.subject, f.rank) for f in swapped] == [("", 0)] and "Check rank 0's stack" in swapped[0].message


def test_a_rank_waiting_for_its_batch_or_a_step_behind_is_the_one_named() -> None:
    data = evaluate(hung_ddp(at(57, BACKWARD, 200), at(57, DATA, 241), at(57, OPTIMIZER, 200)), T)[0]
    assert data.rank == 1 and "rank 1 is still waiting for the batch of step 57" in data.message
    assert data.evidence["waiting"] == [0, 2] and "past backward of step 57" in data.message
    # A step ahead: rank 0 went on to step 58 and waits in its all-reduce; rank 1 is in the
    # optimizer step of 57.
    ahead = evaluate(hung_ddp(at(58, BACKWARD, 200), at(57, OPTIMIZER, 241)), T)[0]
    assert ahead.rank == 1 and ahead.evidence["behind"] == [1]
    # Several ranks behind, several waiting: lists of ranks, no single rank on the finding.
    many = evaluate(hung_ddp(*[at(9, FORWARD, 240) if i in (3, 4) else at(9, BACKWARD, 239) for i in range(8)]), T)[0]
    assert many.rank is None and "ranks 3, 4 are still in the forward pass of step 9" in many.message
    assert "ranks 0–2, 5–7 are in backward of step 9" in many.message


def test_every_rank_at_the_same_point_names_nobody() -> None:
    found = evaluate(hung_ddp(at(57, BACKWARD, 240), at(57, BACKWARD, 239)), T)[0]
    assert found.rank is None and "every rank is at the same point" in found.message
    assert "ranks 0, 1 are in backward of step 57" in found.message and "stopped first" not in found.message


def test_without_phases_the_first_to_stop_is_named_as_before() -> None:
    old = evaluate(hung_ddp(None, None), T)[0]
    assert "rank 0 stopped first" in old.message and "phases" not in old.evidence
    # A step only in "step" (Keras, a plain loop) places nobody: listed, not compared.
    unsplit = evaluate(hung_ddp(at(57, STEP, 240), at(57, STEP, 239)), T)[0]
    assert "rank 0 stopped first" in unsplit.message and "Where the ranks said they are" in unsplit.message
    # One rank said nothing, the other waits in the all-reduce: the waiting one is not named.
    mixed = evaluate(hung_ddp(at(57, BACKWARD, 239), None), T)[0]
    assert "rank 1 stopped first" in mixed.message and "Check rank 1's stack" in mixed.message


def test_a_waiting_rank_is_never_a_straggler_of_a_hung_job() -> None:
    # Before the hang rank 0's own work looked slow (a noisy last minute): it waits now, so no
    # straggler; rank 1, the stuck one, may still be named.
    waiting_slow = hung_ddp(at(57, BACKWARD, 239), at(57, FORWARD, 240), own=(0.5, 0.2))
    assert [(f.rule, f.rank) for f in evaluate(waiting_slow, T)] == [("hung_rank", 1)]
    stuck_slow = hung_ddp(at(57, BACKWARD, 239), at(57, FORWARD, 240), own=(0.2, 0.5))
    assert [(f.rule, f.rank) for f in evaluate(stuck_slow, T)] == [("hung_rank", 1), ("straggler", 1)]
    # Phases unknown: nobody can be told from a waiting rank, so nobody is a straggler.
    assert [f.rule for f in evaluate(hung_ddp(None, None, own=(0.5, 0.2)), T)] == ["hung_rank"]
    # While the job steps, the straggler rule is as before.
    stepping = JobHealthInput("j", NOW, True, ranks((1, 0.5), (1, 0.5), own=(0.5, 0.2)))
    assert rules(stepping) == [("straggler", "rank 0")]


def test_a_lone_hung_rank_says_where_it_is() -> None:
    job = JobHealthInput("j", NOW, True, [RankSteps(0, NOW - 1, 0.5),
                                          RankSteps(1, NOW - 130, 0.5, pending=at(12, DATA, 129))])
    found = evaluate(job, T)
    assert [(f.subject, f.rank) for f in found] == [("rank 1", 1)]
    assert "It is waiting for the batch of step 12 (since " in found[0].message


# -- what the rules may not say ----------------------------------------------------------------

def test_a_rank_the_records_did_not_name_is_never_hung_nor_a_straggler() -> None:
    """Steps sent without a rank are rolled up under -1 (a script outside any launcher, a run outside
    Slurm that finished without a word): nothing says which process that is, so it is never blamed."""
    finished = RankSteps(-1, NOW - 900, 0.5, 0)
    assert rules(JobHealthInput("j", NOW, True, [finished])) == []
    # Beside named ranks that step on: neither a lone hung rank nor a straggler.
    slow = RankSteps(-1, NOW - 1, 0.5, 100, 0.5, 0.9)
    named = ranks((1, 0.5), (1, 0.5), own=(0.2, 0.21))
    assert rules(JobHealthInput("j", NOW, True, [finished, *named])) == []
    assert rules(JobHealthInput("j", NOW, True, [slow, *named])) == []
    # The named ranks are still judged as before.
    assert rules(JobHealthInput("j", NOW, True, [finished, *ranks((1, 0.5), (130, 0.5))])) == [("hung_rank", "rank 1")]


def test_idle_findings_say_when_the_stretch_they_judged_began() -> None:
    read = [GpuWindow("n1/0", "n1", NOW - 4000, NOW - 1, 2.0, 2.0 * 3600, 3600, idle_first_at=NOW - 1810,
                      window_first_at=NOW - 3605),
            GpuWindow("n1/1", "n1", NOW - 4000, NOW - 1, 1.0, 1.0 * 3600, 3600, idle_first_at=NOW - 1820,
                      window_first_at=NOW - 3620)]
    by_rule = {f.rule: f for f in evaluate(JobHealthInput("j", NOW, True, (), read), T)}
    assert by_rule["idle_allocation"].evidence["idle_since"] == NOW - 1820
    assert by_rule["low_utilisation"].evidence["idle_since"] == NOW - 3620
    # Windows given without their first samples: the windows' starts.
    bare = [GpuWindow("n1/0", "n1", NOW - 4000, NOW - 1, 2.0, 2.0 * 3600, 3600)]
    by_rule = {f.rule: f for f in evaluate(JobHealthInput("j", NOW, True, (), bare), T)}
    assert by_rule["idle_allocation"].evidence["idle_since"] == NOW - T.idle_min_s
    assert by_rule["low_utilisation"].evidence["idle_since"] == NOW - T.low_util_window_s
