"""Live health rules: what a running job's stored telemetry says is wrong with it, as findings.

Standard library and :mod:`jobsight.protocol` only (whose straggler rule, in
:mod:`jobsight.protocol.diagnosis`, this applies live); the rules' names are in :mod:`jobsight.rules.rule_names`.
The collector's evaluator (``collector/passes/findings.py``) reads per-rank step sums and per-GPU
windows out of its rollups into the shapes below and calls :func:`evaluate`; the page, the API and the
report show what it stored. A rule gives at most one :class:`Finding` per subject, with the numbers it rests on in
``evidence``.

Rules and what they read:

* ``hung_rank``: a rank has made no step for ``hung_factor`` × its own median step time, and at
  least ``hung_min_s``, while the job still runs. When every rank has stopped, one finding for
  the whole job ("looks hung") instead of one per rank, naming the rank(s) the others wait for
  when the ranks' phases say it (:mod:`jobsight.protocol.step_phases`: one still in its forward
  pass while the others wait in backward's all-reduce), else the rank whose steps stopped first.
* ``straggler``: over the recent window, one rank's own work per step (data wait + forward, the
  part no collective waits in) is well above the other ranks' (``diagnosis.stragglers``); where
  the integration does not measure forward time, the step time itself. While the job looks hung,
  only a rank the others wait for may be named: a rank waiting on a hung peer is no straggler.

When the evaluator read the job's hardware (``JobHealthInput.hardware``: it does so for a job
where one of these two rules fires), their findings say why, from
:mod:`jobsight.rules.hardware_cause`: the straggler's GPU clocks and what held them, an Xid
before a rank went silent, link errors, a saturated host, a tripled data wait, or that nothing in
the hardware differs.
* ``idle_allocation``: GPUs of the job under ``idle_util`` % for ``idle_min_s`` or longer.
* ``low_utilisation``: the job's mean GPU utilisation under ``low_util`` % over ``low_util_window_s``.

Both say in ``evidence["idle_since"]`` (:data:`IDLE_SINCE`) when the stretch they judged began: the
earliest sample of the window that found the GPUs idle (or under-used). The evaluator keeps the value
a finding opened with while it updates it, so it says when the GPUs went idle, not when last judged.

The rank rules (``hung_rank``, ``straggler``) judge named ranks only: steps recorded without a rank
(a process outside a distributed launch; the step rollup's ``-1``) can neither be blamed nor hold
the others back, as nothing says which process they are.
* ``memory_unused``: at the end, no GPU of the job used ``memory_unused_share`` of its memory.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from jobsight.protocol.diagnosis import DEFAULT_THRESHOLDS, Thresholds, stragglers
from jobsight.protocol.step_phases import (
    BACKWARD,
    COLLECTIVE,
    ORDER,
    Behind,
    PendingPhase,
    behind,
    clock,
    place,
    rank_list,
)
from jobsight.rules.hardware_cause import Cause, JobHardware, hang_cause, straggler_cause
from jobsight.rules.rule_names import HUNG_RANK, IDLE_ALLOCATION, LOW_UTILISATION, MEMORY_UNUSED, RULES, STRAGGLER

STRAGGLER_ADVICE = "Check its node, GPU clocks and data shard."
"""What a straggler finding advises when the job's hardware was not read."""
IDLE_SINCE = "idle_since"
"""Evidence key of the idle and low-utilisation findings: seconds since the epoch (a float) at which
the judged stretch began."""
SEVERITIES = ("info", "warning", "critical")


@dataclass(frozen=True)
class HealthThresholds:
    hung_factor: float = 10.0
    hung_min_s: float = 120.0
    straggler_window_s: float = 600.0
    # One straggler rule: the live finding and the post-run diagnosis judge a rank by the same numbers.
    straggler_ratio: float = DEFAULT_THRESHOLDS.straggler_ratio
    straggler_min_s: float = DEFAULT_THRESHOLDS.straggler_min_s
    straggler_min_steps: int = 5
    idle_util: float = 5.0
    idle_min_s: float = 1800.0
    low_util: float = 30.0
    low_util_window_s: float = 3600.0
    memory_unused_share: float = 0.10
    sample_stale_s: float = 300.0
    """A GPU whose latest sample is older than this is not judged idle (no longer sampled)."""


@dataclass(frozen=True)
class RankSteps:
    """One rank's training steps as the evaluator sees them."""

    rank: int
    last_step_at: float
    """Seconds since the epoch of its latest step."""
    median_step_s: float
    """Its usual step time: the median of its recent per-minute mean step times."""
    window_steps: int = 0
    """Steps in the straggler window."""
    window_step_s: float | None = None
    """Mean step time over the window."""
    window_own_s: float | None = None
    """Mean data wait + forward time over the window, when every step of it measured forward."""
    window_data_wait_s: float | None = None
    """Mean data wait (time for its batch) over the window, where measured."""
    pending: PendingPhase | None = None
    """Where it is inside the step it has not finished, when it said so after its last step
    (read only for ranks silent past ``hung_min_s``)."""


@dataclass(frozen=True)
class GpuWindow:
    """One GPU of the job over the evaluator's windows."""

    gpu: str
    """``node/index`` (``node/index/mig`` for a MIG device)."""
    node: str | None
    first_sample_at: float
    """Seconds since the epoch of the GPU's first sample in the job (or window) read."""
    last_sample_at: float
    idle_max_util: float | None = None
    """Highest utilisation over the idle window (``None``: no samples there)."""
    window_util_sum: float = 0.0
    window_util_n: int = 0
    """Utilisation sum and count over the low-utilisation window."""
    power_mean_w: float | None = None
    """Mean power over the most recent minutes (evidence for a hang)."""
    util_mean_recent: float | None = None
    idle_first_at: float | None = None
    """Seconds since the epoch of its earliest sample in the idle window (``None``: not read, taken
    as the window's start)."""
    window_first_at: float | None = None
    """The same for the low-utilisation window."""


@dataclass(frozen=True)
class JobHealthInput:
    job_id: str
    now: float
    running: bool = True
    ranks: Sequence[RankSteps] = ()
    gpus: Sequence[GpuWindow] = ()
    memory_peaks: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    """Per GPU, over the whole run: (peak bytes used, bytes total); for ``memory_unused``."""
    hardware: JobHardware | None = None
    """The job's GPUs, nodes, Xids and rank placement over the straggler window, when read: the
    straggler and hung findings then say why."""


@dataclass(frozen=True)
class Finding:
    rule: str
    subject: str
    """'' for the whole job, ``rank N``, ``gpu node/index``."""
    severity: str
    title: str
    message: str
    evidence: dict[str, Any]
    rank: int | None = None
    node: str | None = None
    gpu: str | None = None
    at: float | None = None
    """The moment in the job's timeline it points at (seconds since the epoch)."""


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def hung_after(rank: RankSteps, t: HealthThresholds) -> float:
    """How long ``rank`` may go without a step before it is hung."""
    return max(t.hung_factor * rank.median_step_s, t.hung_min_s)


def _gpu_evidence(gpus: Sequence[GpuWindow]) -> dict[str, Any]:
    utils = [g.util_mean_recent for g in gpus if g.util_mean_recent is not None]
    powers = [g.power_mean_w for g in gpus if g.power_mean_w is not None]
    return {
        "gpu_util_recent": round(statistics.fmean(utils), 1) if utils else None,
        "gpu_power_recent_w": round(statistics.fmean(powers), 1) if powers else None,
    }


def _stopped(job: JobHealthInput, t: HealthThresholds) -> list[RankSteps]:
    return [r for r in job.ranks if job.now - r.last_step_at > hung_after(r, t)]


def _phases(ranks: Sequence[RankSteps]) -> dict[int, PendingPhase]:
    return {r.rank: r.pending for r in ranks if r.pending is not None}


def _held_by(job: JobHealthInput, t: HealthThresholds) -> Behind | None:
    """When no rank steps and every rank said where it is, the ranks the others wait for."""
    if not job.running or not job.ranks or len(_stopped(job, t)) < len(job.ranks):
        return None
    phases = _phases(job.ranks)
    return behind(phases) if len(phases) == len(job.ranks) else None


def _is(ranks: Sequence[int]) -> str:
    return "is" if len(ranks) == 1 else "are"


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _stacks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}'s stack" if len(ranks) == 1 else f"the stacks of {rank_list(ranks)}"


def _where(ranks: Sequence[int], phases: Mapping[int, PendingPhase], *, still: bool = False) -> str:
    """Where ``ranks`` (all at one point) are, as a clause: "rank 1 is still in the forward pass of
    step 57 (since 12:03:10 UTC)", with the earliest ``since`` of them."""
    since = clock(min(phases[r].since for r in ranks))
    return f"{rank_list(ranks)} {_is(ranks)} {'still ' if still else ''}{place(phases[ranks[0]])} (since {since})"


def _groups(ranks: Iterable[int], phases: Mapping[int, PendingPhase]) -> list[list[int]]:
    """``ranks`` grouped by the point they are at, furthest on first."""
    by: dict[tuple[int, str], list[int]] = {}
    for r in sorted(ranks):
        by.setdefault((phases[r].step, phases[r].phase), []).append(r)
    return [by[k] for k in sorted(by, key=lambda k: (k[0], ORDER.get(k[1], -1)), reverse=True)]


def _phase_evidence(phases: Mapping[int, PendingPhase]) -> dict[str, Any]:
    return {str(r): {"step": p.step, "phase": p.phase, "since": round(p.since, 3)} for r, p in sorted(phases.items())}


def _cause_evidence(cause: Cause) -> dict[str, Any]:
    return {"kind": cause.kind, **cause.evidence}


def _with_cause(f: Finding, cause: Cause | None, *, replace: str = "") -> Finding:
    """``f`` saying ``cause``: its text in place of ``replace`` (the generic advice) or after the
    message, its evidence under ``cause``, and the GPU and node it names."""
    if cause is None:
        return f
    if replace and replace in f.message:
        message = f.message.replace(replace, cause.text)
    else:
        message = f"{f.message} {cause.text}"
    return dataclasses.replace(f, message=message, evidence={**f.evidence, "cause": _cause_evidence(cause)},
                               gpu=cause.gpu or f.gpu, node=cause.node or f.node)


def _last_steps(ranks: Iterable[RankSteps]) -> dict[int, float]:
    return {r.rank: r.last_step_at for r in ranks}


def _job_hung(job: JobHealthInput, silent: Mapping[int, float], evidence: dict[str, Any]) -> Finding:
    """One finding for a job where no rank steps. Its subject stays the job's whatever it names, so
    phases that arrive after it opened update it rather than open another."""
    quiet = _minutes(min(silent.values()))
    phases = _phases(job.ranks)
    if phases:
        evidence["phases"] = _phase_evidence(phases)
    by_rank = {r.rank: r for r in job.ranks}
    held = behind(phases) if len(phases) == len(job.ranks) else None
    if held is not None:
        stuck = list(held.behind)
        evidence.update(behind=stuck, waiting=list(held.ahead))
        others = "; ".join(_where(g, phases) for g in _groups(held.ahead, phases))
        why = (": the gradient all-reduce in backward needs every rank"
               if any(phases[r].phase == BACKWARD for r in held.ahead) else "")
        lead = by_rank[stuck[0]]
        cause = hang_cause(stuck, _last_steps(job.ranks), job.hardware) if job.hardware else None
        return _with_cause(Finding(
            HUNG_RANK, "", "critical", "Job looks hung",
            f"No rank has made a step for {quiet}: {_where(stuck, phases, still=True)}, while {others}. "
            f"{_cap(rank_list(held.ahead))} got further and wait{'s' if len(held.ahead) == 1 else ''} for "
            f"{rank_list(stuck)}, which never got there{why} (each rank reports the phase of a step it stays in). "
            f"Check {_stacks(stuck)} (py-spy dump) before the time limit burns the allocation; the others only wait.",
            evidence, rank=stuck[0] if len(stuck) == 1 else None, at=lead.last_step_at,
        ), cause)
    where = "; ".join(_where(g, phases) for g in _groups(phases, phases)) if phases else ""
    if (len(phases) == len(job.ranks) and len({(p.step, p.phase) for p in phases.values()}) == 1
            and next(iter(phases.values())).phase in ORDER):
        at = min(r.last_step_at for r in job.ranks)
        return Finding(
            HUNG_RANK, "", "critical", "Job looks hung",
            f"No rank has made a step for {quiet}, and every rank is at the same point: "
            f"{_where(sorted(phases), phases)}. None is behind the others, so no one rank holds them: a collective "
            "that never completes (NCCL or the network, or ranks calling different collectives) or something they "
            "all wait on. Check a few ranks' stacks (py-spy dump) before the time limit burns the allocation.",
            evidence, at=at,
        )
    # Phases unknown (an agent that does not report them) or not telling: the rank whose steps
    # stopped first, passing over ranks known to wait in a collective (their last steps end with
    # the stuck rank's, so the tie is broken by timestamps alone).
    waiting = {r for r, p in phases.items() if p.phase in COLLECTIVE}
    unknown = sorted(r.rank for r in job.ranks if r.rank not in phases)
    first = min([r for r in job.ranks if r.rank not in waiting] or job.ranks, key=lambda r: (r.last_step_at, r.rank))
    # A GPU fault on one rank's GPU says more than whose last step came first.
    cause = hang_cause([r.rank for r in job.ranks if r.rank not in waiting], _last_steps(job.ranks),
                       job.hardware) if job.hardware else None
    if cause is not None and cause.rank is not None:
        first = by_rank[cause.rank]
        evidence["faulty_rank"] = cause.rank
        return _with_cause(Finding(
            HUNG_RANK, "", "critical", "Job looks hung",
            f"No rank has made a step for {quiet}, against a usual step of {first.median_step_s:.2f} s, while the job "
            f"is still running; the others wait for rank {first.rank} in a collective that never completes.",
            evidence, rank=first.rank, at=first.last_step_at,
        ), cause)
    return Finding(
        HUNG_RANK, "", "critical", "Job looks hung",
        f"No rank has made a step for {quiet} (rank {first.rank} stopped first, "
        f"{_minutes(silent[first.rank])} ago), against a usual step of {first.median_step_s:.2f} s, while the job is "
        "still running: a collective that never completes (an NCCL hang) or a stuck rank holds the whole "
        f"allocation. Check rank {first.rank}'s stack (py-spy dump) before the time limit burns it."
        + (f" Where the ranks said they are: {where}" if where else "")
        + (f"; {rank_list(unknown)} said nothing (an agent that does not report phases, or a process stuck "
           "where Python cannot run)." if where and unknown else "." if where else ""),
        evidence, at=first.last_step_at,
    )


def hung(job: JobHealthInput, t: HealthThresholds) -> list[Finding]:
    if not job.running or not job.ranks:
        return []
    silent = {r.rank: job.now - r.last_step_at for r in job.ranks}
    stopped = _stopped(job, t)
    if not stopped:
        return []
    per_rank = {
        str(r.rank): {"last_step_at": r.last_step_at, "silent_s": round(silent[r.rank], 1),
                      "median_step_s": round(r.median_step_s, 6)}
        for r in job.ranks
    }
    evidence = {"ranks": per_rank, **_gpu_evidence(job.gpus)}
    if len(stopped) == len(job.ranks):
        return [_job_hung(job, silent, evidence)]
    out = []
    for r in stopped:
        where = f" It is {place(r.pending)} (since {clock(r.pending.since)})." if r.pending else ""
        cause = hang_cause([r.rank], _last_steps([r]), job.hardware) if job.hardware else None
        out.append(_with_cause(Finding(
            HUNG_RANK, f"rank {r.rank}", "critical", f"Rank {r.rank} has stopped stepping",
            f"Rank {r.rank} has made no step for {_minutes(silent[r.rank])}, {silent[r.rank] / r.median_step_s:.0f}× "
            f"its usual {r.median_step_s:.2f} s, while the other ranks go on.{where}",
            {**evidence, "rank": r.rank, "silent_s": round(silent[r.rank], 1),
             "median_step_s": round(r.median_step_s, 6), "threshold_s": round(hung_after(r, t), 1),
             **({"phases": _phase_evidence({r.rank: r.pending})} if r.pending else {})},
            rank=r.rank, at=r.last_step_at,
        ), cause))
    return out


def straggler(job: JobHealthInput, t: HealthThresholds) -> list[Finding]:
    ranks = [r for r in job.ranks if r.window_steps >= t.straggler_min_steps and r.window_step_s is not None]
    if not job.running or len(ranks) < 2:
        return []
    own = all(r.window_own_s is not None for r in ranks)
    values = {r.rank: (r.window_own_s if own else r.window_step_s) or 0.0 for r in ranks}
    slow = stragglers(values, Thresholds(straggler_ratio=t.straggler_ratio, straggler_min_s=t.straggler_min_s))
    if len(_stopped(job, t)) == len(job.ranks):
        # No rank steps: the window holds only what came before, and a rank waiting in the
        # all-reduce for a stuck peer is not slow. Only a rank the others are known to wait for
        # may still be named.
        held = _held_by(job, t)
        slow = [r for r in slow if held is not None and r in held.behind]
    if not slow:
        return []
    rank = slow[0]
    typical = statistics.median(values.values())
    quantity = "own work per step (data wait + forward)" if own else "step time"
    steps = {str(r.rank): round(r.window_step_s or 0.0, 6) for r in ranks}
    waits = {r.rank: r.window_data_wait_s for r in ranks if r.window_data_wait_s is not None}
    cause = straggler_cause(rank, job.hardware, waits) if job.hardware else None
    return [_with_cause(Finding(
        STRAGGLER, f"rank {rank}", "warning", f"Rank {rank} is a straggler",
        f"Over the last {_minutes(t.straggler_window_s)}, rank {rank}'s {quantity} is {values[rank] * 1000:.1f} ms "
        f"against {typical * 1000:.1f} ms across ranks ({values[rank] / typical:.2f}×)"
        + ("; the other ranks spend the difference waiting for it in the gradient all-reduce, so every step "
           "runs at its pace. " if own else ". ")
        + STRAGGLER_ADVICE,
        {"rank": rank, "compared": "data_wait_s + forward_s" if own else "duration_s",
         "by_rank_s": {str(k): round(v, 6) for k, v in values.items()}, "ranks_median_s": round(typical, 6),
         "ratio": round(values[rank] / typical, 3), "step_s_by_rank": steps, "stragglers": slow,
         "window_s": t.straggler_window_s},
        rank=rank,
    ), cause, replace=STRAGGLER_ADVICE)]


def idle_allocation(job: JobHealthInput, t: HealthThresholds) -> list[Finding]:
    if not job.running:
        return []
    idle = [
        g for g in job.gpus
        if g.idle_max_util is not None and g.idle_max_util < t.idle_util
        and job.now - g.first_sample_at >= t.idle_min_s and job.now - g.last_sample_at <= t.sample_stale_s
    ]
    if not idle:
        return []
    names = sorted(g.gpu for g in idle)
    since = min(job.now - t.idle_min_s if g.idle_first_at is None else g.idle_first_at for g in idle)
    return [Finding(
        IDLE_ALLOCATION, "", "warning", f"{len(idle)} of {len(job.gpus)} GPUs idle",
        f"{', '.join(names[:8])}{' …' if len(names) > 8 else ''} stayed under {t.idle_util:g} % utilisation for "
        f"the last {_minutes(t.idle_min_s)} or more: allocated and unused. Check that the code runs on them, "
        "or release them.",
        {"idle_gpus": names, "gpus": len(job.gpus), "max_util": {g.gpu: g.idle_max_util for g in idle},
         "threshold_util": t.idle_util, "window_s": t.idle_min_s, IDLE_SINCE: since},
        node=idle[0].node if len({g.node for g in idle}) == 1 else None,
        gpu=names[0] if len(names) == 1 else None,
    )]


def low_utilisation(job: JobHealthInput, t: HealthThresholds) -> list[Finding]:
    covered = [g for g in job.gpus if g.window_util_n and job.now - g.first_sample_at >= t.low_util_window_s]
    if not job.running or not covered:
        return []
    total = sum(g.window_util_sum for g in covered)
    count = sum(g.window_util_n for g in covered)
    mean = total / count
    if mean >= t.low_util:
        return []
    since = min(job.now - t.low_util_window_s if g.window_first_at is None else g.window_first_at for g in covered)
    return [Finding(
        LOW_UTILISATION, "", "warning", "Low GPU utilisation",
        f"The job's {len(covered)} GPUs averaged {mean:.1f} % utilisation over the last "
        f"{_minutes(t.low_util_window_s)} (under {t.low_util:g} %). Input loading, small batches or waiting on "
        "other ranks are the usual causes; the profile window and the diagnosis say which.",
        {"mean_util": round(mean, 2), "gpus": len(covered), "samples": count, "threshold_util": t.low_util,
         "window_s": t.low_util_window_s, IDLE_SINCE: since},
    )]


def memory_unused(job: JobHealthInput, t: HealthThresholds) -> list[Finding]:
    peaks = {gpu: used / total for gpu, (used, total) in job.memory_peaks.items() if total}
    if job.running or not peaks or max(peaks.values()) >= t.memory_unused_share:
        return []
    top = max(peaks.values())
    return [Finding(
        MEMORY_UNUSED, "", "info", "GPU memory unused",
        f"No GPU of the job used more than {100 * top:.1f} % of its memory over the whole run: a GPU with less "
        "memory (or a MIG slice), or several such jobs per GPU, would have done.",
        {"peak_share_by_gpu": {g: round(s, 4) for g, s in sorted(peaks.items())}, "threshold": t.memory_unused_share},
    )]


def _named_ranks(job: JobHealthInput) -> JobHealthInput:
    """``job`` less the steps recorded without a rank (negative: the rollup's ``NO_RANK``)."""
    if all(r.rank >= 0 for r in job.ranks):
        return job
    return dataclasses.replace(job, ranks=[r for r in job.ranks if r.rank >= 0])


JUDGES: Final[Mapping[str, Callable[[JobHealthInput, HealthThresholds], list[Finding]]]] = {
    HUNG_RANK: hung, STRAGGLER: straggler, IDLE_ALLOCATION: idle_allocation, LOW_UTILISATION: low_utilisation,
    MEMORY_UNUSED: memory_unused,
}
"""Each rule's function, by its name, in the order of :data:`~jobsight.rules.rule_names.RULES`."""
RANK_RULES: Final = (HUNG_RANK, STRAGGLER)
"""Rules that judge named ranks only (see above)."""


def evaluate(job: JobHealthInput, t: HealthThresholds, rules: Iterable[str] = RULES) -> list[Finding]:
    """Every finding the named rules give for ``job``."""
    chosen = set(rules)
    named = _named_ranks(job)
    out: list[Finding] = []
    for name, rule in JUDGES.items():
        if name in chosen:
            out.extend(rule(named if name in RANK_RULES else job, t))
    return out
