"""Plain-language hints from a profile summary and a job's samples.

Standard library only: the agent runs it on each profile window and the collector
on a whole job (several ranks' steps, GPU samples, each rank's latest profile). Each rule returns at most one
hint: ``{"rule", "severity", "title", "message", "evidence"}``, where ``evidence``
holds the numbers the hint rests on, so a reader can check it.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

Hint = dict[str, Any]

_HALF_KERNELS = re.compile(r"fp16|bf16|half|bfloat|h884|h1688|h16816|s16816|f16", re.I)
_MATMUL = re.compile(r"gemm|matmul|conv|mm\b|addmm|bmm|linear|cutlass|sm\d+_xmma", re.I)
# Ops a training step legitimately calls many times (one per parameter, say) are still a
# Python loop over tensors when one line of the user's code issues them; besides that rule
# (see _python_loop), nothing is excluded but the profiler's own markers.
_MARKERS = re.compile(r"^(ProfilerStep#|\[memory\]|enumerate\(DataLoader\))")


@dataclass(frozen=True)
class Thresholds:
    input_bound_share: float = 0.20
    launch_bound_idle_share: float = 0.40
    launch_bound_kernel_us: float = 20.0
    loop_calls_per_step: float = 100.0
    comm_share: float = 0.30
    comm_overlap: float = 0.50
    # Across ranks: a rank whose collective share is at most this fraction of the most
    # waiting rank's, and this much lower, is the one the others wait for.
    comm_straggler_ratio: float = 0.50
    comm_straggler_gap: float = 0.20
    memory_share: float = 0.92
    straggler_ratio: float = 1.25
    straggler_min_s: float = 0.002
    idle_gpu_util: float = 10.0
    idle_device_share: float = 0.50


DEFAULT_THRESHOLDS: Final = Thresholds()


def _hint(rule: str, severity: str, title: str, message: str, **evidence: Any) -> Hint:
    return {"rule": rule, "severity": severity, "title": title, "message": message, "evidence": evidence}


def _pct(share: float) -> str:
    return f"{100 * share:.0f}%"


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


# -- rules over one profile summary --------------------------------------------------------


def _input_bound_profile(summary: Mapping[str, Any], t: Thresholds) -> Hint | None:
    share = _num(summary.get("breakdown", {}).get("data_loading_share"))
    if share is None or share < t.input_bound_share:
        return None
    return _hint(
        "input_bound", "warning", "Waiting for data",
        f"{_pct(share)} of the profiled steps went to loading data. More DataLoader workers, "
        "pin_memory, prefetching or a faster input format would feed the model faster.",
        data_loading_share=share, threshold=t.input_bound_share,
    )


def _launch_bound(summary: Mapping[str, Any], t: Thresholds) -> Hint | None:
    times = summary.get("breakdown", {})
    if times.get("basis") != "device":
        return None
    idle = _num(times.get("idle_share"))
    mean_kernel = _num(times.get("kernel_mean_us"))
    if idle is None or mean_kernel is None:
        return None
    if idle < t.launch_bound_idle_share or mean_kernel > t.launch_bound_kernel_us:
        return None
    steps = max(int(summary.get("steps") or 1), 1)
    kernels = int(times.get("kernel_count") or 0)
    return _hint(
        "launch_bound", "warning", "CPU cannot keep the GPU busy",
        f"The GPU sat idle {_pct(idle)} of the time while running many small kernels "
        f"({kernels // steps} per step, {mean_kernel:.1f} µs on average): the CPU launching them is the "
        "bottleneck. Larger batches, torch.compile or CUDA graphs cut launches.",
        device_idle_share=idle, kernel_mean_us=mean_kernel, kernels_per_step=kernels // steps,
    )


def _no_mixed_precision(summary: Mapping[str, Any], t: Thresholds) -> Hint | None:
    if summary.get("device") != "cuda":
        return None
    precision = str(summary.get("precision") or "")
    if any(tag in precision for tag in ("16", "bf", "half", "fp8")):
        return None
    ops = summary.get("ops_by_self_device") or []
    if any(_HALF_KERNELS.search(str(op.get("name", ""))) for op in ops):
        return None
    total = _num(summary.get("self_device_total_us")) or 0.0
    matmul = sum(_num(op.get("self_device_us")) or 0.0 for op in ops if _MATMUL.search(str(op.get("name", ""))))
    share = matmul / total if total else 0.0
    if share < 0.2:
        return None
    return _hint(
        "no_mixed_precision", "info", "No mixed precision",
        f"Matrix multiplications and convolutions take {_pct(share)} of GPU time and all of them run in "
        "32-bit. bf16/fp16 autocast (Lightning: precision='bf16-mixed') typically makes them several times faster.",
        matmul_device_share=round(share, 3), precision=precision or None,
    )


def _python_loop(summary: Mapping[str, Any], t: Thresholds) -> Hint | None:
    """Only calls that one line of the user's code repeats: ``most_called`` ops with a ``source``
    (profiles recorded with stacks); ops from framework internals have none and never fire."""
    by_line: dict[tuple[Any, Any], list[tuple[Mapping[str, Any], Mapping[str, Any], float]]] = defaultdict(list)
    for op in summary.get("most_called") or []:
        source = op.get("source")
        per_step = _num(source.get("calls_per_step")) if isinstance(source, Mapping) else None
        if per_step is None or per_step < t.loop_calls_per_step or _MARKERS.search(str(op.get("name"))):
            continue
        by_line[(source.get("file"), source.get("line"))].append((op, source, per_step))
    if not by_line:
        return None
    # The line with the most calls, a line found in the source before a function's first line.
    (file, line), found = max(
        by_line.items(),
        key=lambda item: (any(s.get("exact") for _, s, _ in item[1]), max(per_step for _, _, per_step in item[1])),
    )
    # One line issues several ops (cross_entropy: log_softmax, nll_loss, ...): name the function it
    # calls, before an op that an operator or subscript on the line issues.
    op, source, per_step = min(found, key=lambda entry: (bool(entry[1].get("operator")), -entry[2]))
    calls, loop_line = str(source.get("calls")), source.get("loop_line")
    site = f"{file}:{line} {calls} ×{per_step:.0f}/step"
    where = f" in the loop at line {loop_line}" if isinstance(loop_line, int) else ""
    total = _num(summary.get("self_cpu_total_us")) or 0.0
    share = sum(_num(o.get("self_cpu_us")) or 0.0 for o, _, _ in found) / total if total else 0.0
    return _hint(
        "python_loop", "warning", "A Python loop over tensor operations",
        f"{site}: {source.get('function')}() calls {calls} {per_step:.0f} times per step{where}, one small "
        "operation per element (a per-token loss, say). Batching it into one tensor operation removes the loop "
        "and its overhead.",
        site=site, file=file, line=line, calls=calls, calls_per_step=per_step, function=source.get("function"),
        loop_line=loop_line, line_exact=source.get("exact"), ops=[str(o.get("name")) for o, _, _ in found][:5],
        steps=summary.get("steps"), self_cpu_share=round(share, 3), threshold=t.loop_calls_per_step,
    )


def _communication_bound(summary: Mapping[str, Any], t: Thresholds) -> Hint | None:
    times = summary.get("breakdown", {})
    share = _num(times.get("communication_share"))
    overlap = _num(times.get("comm_overlap"))
    if share is None or share < t.comm_share or (overlap is not None and overlap >= t.comm_overlap):
        return None
    world = _num(summary.get("world_size"))
    # One rank's profile cannot tell a slow interconnect from waiting for a slower rank.
    caveat = (
        " This is one rank's view: if another rank spends much less of its step in collectives, this one is "
        "waiting for it (a straggler); the job's diagnosis compares every profiled rank."
        if world is not None and world > 1 else ""
    )
    return _hint(
        "communication_bound", "warning", "Communication-bound",
        f"Collectives (all-reduce and friends) take {_pct(share)} of the step and only "
        f"{_pct(overlap or 0.0)} of that overlaps computation. Larger per-GPU batches, gradient accumulation, "
        f"bucket tuning or a faster interconnect help.{caveat}",
        communication_share=share, comm_overlap=overlap,
    )


def _memory_profile(summary: Mapping[str, Any], t: Thresholds) -> Hint | None:
    memory = summary.get("memory") or {}
    total = _num(memory.get("total_bytes"))
    peak = _num(memory.get("peak_reserved_bytes"))
    retries = int(memory.get("alloc_retries") or 0)
    ooms = int(memory.get("ooms") or 0)
    share = peak / total if total and peak is not None else None
    if not (retries or ooms or (share is not None and share >= t.memory_share)):
        return None
    return _hint(
        "memory_pressure", "warning", "GPU memory pressure",
        f"Peak reserved memory is {_pct(share or 0.0)} of the GPU, with {retries} allocator retries and "
        f"{ooms} out-of-memory errors: the allocator is flushing its cache to fit. Activation checkpointing, "
        "a smaller batch or mixed precision frees memory.",
        peak_share=round(share, 3) if share is not None else None, alloc_retries=retries, ooms=ooms,
    )


def _idle_device(summary: Mapping[str, Any], t: Thresholds) -> Hint | None:
    times = summary.get("breakdown", {})
    idle = _num(times.get("idle_share"))
    if times.get("basis") != "device" or idle is None or idle < t.idle_device_share:
        return None
    return _hint(
        "idle_gpu", "warning", "GPU idle",
        f"The GPU had no work {_pct(idle)} of the profiled time.",
        device_idle_share=idle,
    )


# -- rules over a job's samples ------------------------------------------------------------


def _input_bound_steps(steps: Sequence[Mapping[str, Any]], t: Thresholds) -> Hint | None:
    waited = [(_num(s.get("data_wait_s")), _num(s.get("duration_s"))) for s in steps]
    pairs = [(w, d) for w, d in waited if w is not None and d is not None]
    total = sum(d for _, d in pairs)
    if len(pairs) < 3 or total <= 0:
        return None
    share = sum(w for w, _ in pairs) / total
    if share < t.input_bound_share:
        return None
    return _hint(
        "input_bound", "warning", "Waiting for data",
        f"{_pct(share)} of step time over {len(pairs)} steps was spent waiting for the next batch. "
        "More DataLoader workers, pin_memory or prefetching would feed the model faster.",
        data_wait_share=round(share, 3), steps=len(pairs), threshold=t.input_bound_share,
    )


def stragglers(step_time_by_rank: Mapping[int, float], t: Thresholds = DEFAULT_THRESHOLDS) -> list[int]:
    """The straggler rule, the one the job page, ``/diagnosis`` and the health rules apply: the
    ranks whose typical value (step time, or each rank's own work per step, data wait + forward,
    where every rank reports it) is at least ``t.straggler_ratio`` times the median across ranks
    and at least ``t.straggler_min_s`` longer; slowest first. Fewer than two ranks have none."""
    if len(step_time_by_rank) < 2:
        return []
    overall = statistics.median(step_time_by_rank.values())
    if overall <= 0:
        return []
    slow = [
        rank for rank, value in step_time_by_rank.items()
        if value >= t.straggler_ratio * overall and value - overall >= t.straggler_min_s
    ]
    return sorted(slow, key=lambda rank: (-step_time_by_rank[rank], rank))


def _straggler(steps: Sequence[Mapping[str, Any]], t: Thresholds) -> Hint | None:
    """Per-rank medians of each rank's own work (data wait + forward) when every rank reports
    ``forward_s``: in synchronous data parallelism every rank's step time is alike, as the fast
    ranks wait for the slow one in the all-reduce. Else the step time itself."""
    durations: dict[int, list[float]] = defaultdict(list)
    own: dict[int, list[float]] = defaultdict(list)
    for s in steps:
        rank, duration, forward = s.get("rank"), _num(s.get("duration_s")), _num(s.get("forward_s"))
        if not isinstance(rank, int):
            continue
        if duration is not None:
            durations[rank].append(duration)
        if forward is not None:
            own[rank].append((_num(s.get("data_wait_s")) or 0.0) + forward)
    by_own = bool(own) and set(own) >= set(durations)
    values = own if by_own else durations
    medians = {rank: statistics.median(v) for rank, v in values.items() if v}
    slow = stragglers(medians, t)
    if not slow:
        return None
    rank, slowest, overall = slow[0], medians[slow[0]], statistics.median(medians.values())
    if by_own:
        message = (
            f"Rank {rank}'s own work per step (data wait + forward, outside the collectives) has a median of "
            f"{slowest * 1000:.1f} ms against {overall * 1000:.1f} ms across ranks ({slowest / overall:.2f}×); the "
            "other ranks wait for it in the gradient all-reduce, so every rank's step looks equally slow. Check its "
            "node, clocks and data shard."
        )
    else:
        message = (
            f"Rank {rank}'s median step takes {slowest * 1000:.1f} ms against {overall * 1000:.1f} ms across ranks "
            f"({slowest / overall:.2f}×); every other rank waits for it at each synchronisation. Check its node, "
            "GPU clocks and data shard."
        )
    return _hint(
        "straggler", "warning", f"Rank {rank} is a straggler", message,
        rank=rank, quantity="data_wait_s + forward_s" if by_own else "duration_s",
        rank_median_s=round(slowest, 6), ranks_median_s=round(overall, 6),
        ratio=round(slowest / overall, 3), ranks=len(medians), stragglers=slow,
    )


def _communication_across_ranks(profiles: Mapping[int, Mapping[str, Any]], t: Thresholds) -> Hint | None:
    """With each rank's latest profile: the ranks that wait in collectives and the one that does
    not are a straggler (named, with both shares); communication-bound only when all wait alike."""
    shares: dict[int, float] = {}
    overlaps: list[float] = []
    for rank, summary in profiles.items():
        times = summary.get("breakdown") if isinstance(summary, Mapping) else None
        share = _num(times.get("communication_share")) if isinstance(times, Mapping) else None
        if isinstance(rank, int) and share is not None:
            shares[rank] = share
            overlap = _num(times.get("comm_overlap")) if isinstance(times, Mapping) else None
            if overlap is not None:
                overlaps.append(overlap)
    if len(shares) < 2:
        return None
    waiting = max(shares, key=lambda r: (shares[r], -r))
    most = shares[waiting]
    if most < t.comm_share:
        return None
    by_rank = {str(r): round(shares[r], 4) for r in sorted(shares)}
    slow = sorted(
        (r for r, share in shares.items()
         if share <= t.comm_straggler_ratio * most and most - share >= t.comm_straggler_gap),
        key=lambda r: (shares[r], r),
    )
    if slow:
        rank = slow[0]
        return _hint(
            "straggler", "warning", f"Rank {rank} is a straggler",
            f"Rank {rank} spends {_pct(shares[rank])} of its profiled steps in collectives while rank {waiting} spends "
            f"{_pct(most)}: the other ranks wait in the all-reduce for rank {rank}, which does more work of its own "
            f"each step. That is not the interconnect; look at what rank {rank} does differently (its data shard, "
            "extra work, its node and clocks).",
            rank=rank, quantity="communication_share", rank_share=shares[rank], waiting_rank=waiting,
            waiting_share=most, communication_share_by_rank=by_rank, stragglers=slow, ranks=len(shares),
        )
    overlap = statistics.median(overlaps) if overlaps else None
    if min(shares.values()) < t.comm_share or (overlap is not None and overlap >= t.comm_overlap):
        return None
    return _hint(
        "communication_bound", "warning", "Communication-bound",
        f"Every rank spends {_pct(min(shares.values()))} to {_pct(most)} of its step in collectives (all-reduce "
        f"and friends), alike, and only {_pct(overlap or 0.0)} of that overlaps computation. Larger per-GPU "
        "batches, gradient accumulation, bucket tuning or a faster interconnect help.",
        communication_share=round(statistics.median(shares.values()), 4), comm_overlap=overlap,
        communication_share_by_rank=by_rank, ranks=len(shares),
    )


def _gpu_samples(samples: Sequence[Mapping[str, Any]], t: Thresholds) -> list[Hint]:
    hints: list[Hint] = []
    utils = [u for u in (_num(s.get("util_gpu")) for s in samples) if u is not None]
    if len(utils) >= 3:
        mean = statistics.fmean(utils)
        if mean < t.idle_gpu_util:
            hints.append(_hint(
                "idle_gpu", "warning", "GPU idle",
                f"The job's GPUs averaged {mean:.1f}% utilisation over {len(utils)} samples: the allocation is "
                "mostly unused. Check that the code runs on the GPU and is not waiting on input or other ranks.",
                mean_util=round(mean, 2), samples=len(utils), threshold=t.idle_gpu_util,
            ))
    shares = [
        used / total for used, total in ((_num(s.get("mem_used")), _num(s.get("mem_total"))) for s in samples)
        if used is not None and total
    ]
    if shares and max(shares) >= t.memory_share:
        hints.append(_hint(
            "memory_pressure", "warning", "GPU memory nearly full",
            f"GPU memory reached {_pct(max(shares))} of capacity; the allocator may be flushing its cache "
            "and an out-of-memory error is close.",
            max_memory_share=round(max(shares), 3), samples=len(shares),
        ))
    return hints


_PROFILE_RULES: tuple[Callable[[Mapping[str, Any], Thresholds], Hint | None], ...] = (
    _input_bound_profile, _launch_bound, _no_mixed_precision, _python_loop,
    _communication_bound, _memory_profile, _idle_device,
)


ACROSS_RANKS: Final = frozenset({"communication_bound"})
"""Rules decided across ranks once two or more ranks' profiles are in hand: one rank's own
hint for them (the waiting rank's "communication-bound") is the symptom, not the diagnosis."""


def diagnose(
    profile: Mapping[str, Any] | None = None,
    *,
    steps: Sequence[Mapping[str, Any]] = (),
    gpu_samples: Sequence[Mapping[str, Any]] = (),
    rank_profiles: Mapping[int, Mapping[str, Any]] | None = None,
    thresholds: Thresholds | None = None,
) -> list[Hint]:
    """Every hint that applies, one per rule (a rule seen twice keeps the first, in the order:
    profile, across ranks, steps, samples).

    ``profile`` is a summary from :func:`jobsight.agent.training.profiling.summarize` (plus its breakdown);
    ``rank_profiles`` each rank's latest summary (straggler or communication-bound across ranks);
    ``steps`` are step records or rows (``rank``, ``duration_s``, ``data_wait_s``, ``forward_s``);
    ``gpu_samples`` rows with ``util_gpu``, ``mem_used``, ``mem_total``.
    """
    t = thresholds or DEFAULT_THRESHOLDS
    hints: list[Hint | None] = []
    if profile:
        hints.extend(rule(profile, t) for rule in _PROFILE_RULES)
    hints.append(_communication_across_ranks(rank_profiles or {}, t))
    hints.extend((_input_bound_steps(steps, t), _straggler(steps, t), *_gpu_samples(gpu_samples, t)))
    seen: set[str] = set()
    unique = []
    for hint in hints:
        if hint is not None and hint["rule"] not in seen:
            seen.add(hint["rule"])
            unique.append(hint)
    return unique
