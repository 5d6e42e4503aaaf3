"""The simulated data-parallel job of ``jobsight up --demo``: what its ranks and GPUs do, second by second.

A 2-node × 8-GPU job, one rank per GPU, trains in lock step as synchronous data parallelism does:
every step, each rank runs forward and backward on its own batch, and the gradient all-reduce
makes every rank wait for the slowest before the step can end. The run tells one story:

1. **healthy** (``healthy_s``): every rank does the same work; the GPUs are busy.
2. **straggling** (``straggler_s``): one rank's GPU overheats and throttles its clocks, so that
   rank's forward pass grows. The others reach the all-reduce first and wait there, so every
   rank's *step* time grows alike; only the time from batch arrival to backward start
   (``forward_s``) tells the slow rank apart. The waiting GPUs keep a collective kernel
   running (NVML's utilisation stays high) on few SMs, at less power.
3. **hung** (to the time limit): the slow rank stops making progress on the host side; its GPU
   idles with its memory still held, while the other ranks spin in the all-reduce that never
   completes (utilisation high, power low): the classic hang that burns the allocation. The other
   ranks' host side finishes one more step before it blocks (CUDA work is queued asynchronously),
   so the hung rank is the one whose steps stopped first; then no rank steps again. Like the real
   agent (``agent/training/step_watch.py``), each rank says :data:`PHASE_REPORT_S` later where it
   stays: the slow rank in the forward pass of the step it never finished, the others in backward's
   all-reduce of the next. At ``time_limit_s`` Slurm ends the job (state ``timeout``).

:class:`SimulatedRun` produces the wire records (steps, metrics, logs, job start and end) and
the GPU loads for any moment; ``demo_cluster`` turns the loads into readings with the simulated
GPU reader and ships everything.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Final

from jobsight.agent.node.gpu.simulated import GiB, GpuLoad
from jobsight.protocol.step_phases import BACKWARD, FORWARD, PendingPhase

CLUSTER: Final = "simulated"
NODES: Final = ("sim-gpu01", "sim-gpu02")
GPUS_PER_NODE: Final = 8
RANKS: Final = len(NODES) * GPUS_PER_NODE
SLOW_RANK: Final = 11
"""The rank that falls behind and then hangs: node 2, GPU 3."""
BATCH_PER_RANK: Final = 32
LAUNCH_S: Final = 25.0
"""From the job's start to its first step: starting the ranks, loading the first shard."""
STEPS_PER_EPOCH: Final = 400
USER, ACCOUNT, PARTITION = "ana", "nlp", "gpu"
NAME: Final = "simulated: llm-pretrain, 2 nodes × 8 GPUs, data parallel"
PHASE_REPORT_S: Final = 30.0
"""How long a rank stays in one phase before it says so (the agent's default ``phase_report_s``)."""


@dataclass(frozen=True)
class Timings:
    """How long each part of the story lasts, in seconds."""

    healthy_s: float
    straggler_s: float
    time_limit_s: float
    """The job's Slurm time limit: it hangs from the end of the straggling part until this."""
    step_s: float
    """A healthy step's duration."""


def us(seconds: float) -> int:
    return int(round(seconds * 1_000_000))


class SimulatedRun:
    """One run of the simulated job, started at ``start_s`` (Unix seconds, possibly in the past)."""

    def __init__(self, job_id: str, start_s: float, timings: Timings, seed: int = 0) -> None:
        self.job_id = job_id
        self.start_s = start_s
        self.timings = timings
        self.hang_s = start_s + timings.healthy_s + timings.straggler_s
        self.end_s = start_s + timings.time_limit_s
        self._random = random.Random(seed)
        base_pid = self._random.randrange(20_000, 60_000, 100)
        self.pids = [base_pid + rank for rank in range(RANKS)]
        self._step = 0
        self.first_step_s = start_s + LAUNCH_S
        self._next_start = self.first_step_s
        self._memory = [int((58 + self._random.uniform(0, 6)) * GiB) for _ in range(RANKS)]
        self._logged_start = False
        self._ran_ahead = False
        self._blocked: tuple[float, float, int] | None = None
        """When the slow rank's last step began, when the others blocked in the never-ending
        all-reduce, and the step they block in."""
        self._phases_said = False
        self._pending: tuple[list[float], list[float]] | None = None

    @staticmethod
    def place(rank: int) -> tuple[str, int]:
        """The node and GPU index of ``rank``."""
        return NODES[rank // GPUS_PER_NODE], rank % GPUS_PER_NODE

    def phase(self, t: float) -> str:
        if t < self.start_s + self.timings.healthy_s:
            return "healthy"
        return "straggling" if t < self.hang_s else "hung"

    # -- the job's start and end, as the Slurm prolog and epilog of each node report them ----------

    def started(self) -> list[tuple[str, dict[str, Any]]]:
        """``(node, job_started)`` per node, at the job's start."""
        return [(node, {
            "kind": "job_started", "job": self.job_id, "ts": us(self.start_s), "node": node, "user": USER,
            "account": ACCOUNT, "partition": PARTITION, "name": NAME, "nodes": list(NODES),
            "node_count": len(NODES), "gpus": [str(i) for i in range(GPUS_PER_NODE)],
            "time_limit_s": int(self.timings.time_limit_s), "demo": True,
            "attrs": {"simulated": True, "story": f"rank {SLOW_RANK} falls behind, then hangs"},
        }) for node in NODES]

    def ended(self, t: float, state: str) -> list[tuple[str, dict[str, Any]]]:
        """``(node, job_ended)`` per node at ``t``: ``timeout`` at the limit, ``cancelled`` when stopped."""
        return [(node, {"kind": "job_ended", "job": self.job_id, "ts": us(t), "node": node, "state": state,
                        "exit_code": None}) for node in NODES]

    # -- the GPUs ------------------------------------------------------------------------------------

    def loads(self, t: float) -> list[GpuLoad]:
        """What each rank's GPU is doing at ``t``, by rank."""
        if t < self.first_step_s:
            return [GpuLoad(util=0.0, mem_used=self._memory[r] // 4, pids=(self.pids[r],)) for r in range(RANKS)]
        phase = self.phase(t)
        loads = []
        for rank in range(RANKS):
            held = self._memory[rank]
            pids = (self.pids[rank],)
            if phase == "healthy":
                load = GpuLoad(util=94.0, sm_active=86.0, mem_used=held, pids=pids)
            elif rank == SLOW_RANK:
                load = (GpuLoad(util=99.0, sm_active=93.0, mem_used=held, pids=pids, throttled=True)
                        if phase == "straggling" else GpuLoad(util=0.0, mem_used=held, pids=pids))
            elif phase == "straggling":
                # Waiting in the all-reduce for the slow rank: a collective kernel stays resident.
                wait = 1.0 - 1.0 / self._slowdown(t)
                load = GpuLoad(util=97.0, sm_active=86.0 * (1.0 - wait) + 3.0 * wait, mem_used=held, pids=pids)
            else:
                # Spinning in an all-reduce that never completes: busy by NVML's count, nearly no SMs.
                load = GpuLoad(util=100.0, sm_active=2.0, mem_used=held, pids=pids)
            loads.append(load)
        return loads

    def _slowdown(self, t: float) -> float:
        """The slow rank's forward time over its healthy one: 1 until it straggles, then rising over a
        minute (the GPU heating up) to 2.6."""
        into = t - (self.start_s + self.timings.healthy_s)
        if into <= 0:
            return 1.0
        return 1.0 + 1.6 * min(1.0, into / 60.0)

    # -- the training processes ----------------------------------------------------------------------

    def records_until(self, t: float) -> list[tuple[str, dict[str, Any]]]:
        """``(node, record)`` for every step, metric and log line of the ranks that ended by ``t``."""
        out: list[tuple[str, dict[str, Any]]] = []
        if not self._logged_start and t >= self.first_step_s:
            self._logged_start = True
            out += self._launch_logs(self.first_step_s)
        while True:
            began = self._next_start
            if began >= self.end_s or (began >= self.hang_s and self._ran_ahead):
                return out + self._phases_until(t)
            hung = began >= self.hang_s
            if self._pending is None:  # drawn once per step, however many ticks it spans
                self._pending = self._step_times(began, without=SLOW_RANK if hung else None)
            duration, forward = self._pending
            if began + max(duration) > t:
                return out
            self._pending = None
            self._step += 1
            self._next_start = began + max(duration)
            out += self._step_records(began, duration, forward, without=SLOW_RANK if hung else None)
            self._ran_ahead = hung
            if hung:
                self._blocked = (began, self._next_start, self._step + 1)

    def _phases_until(self, t: float) -> list[tuple[str, dict[str, Any]]]:
        """Each rank's phase report, once, when the hang has lasted :data:`PHASE_REPORT_S`: the
        slow rank is still in the forward pass of the step the others finished without it; they
        are in backward's all-reduce of the step after, waiting for it."""
        if self._blocked is None or self._phases_said or t < self._blocked[1] + PHASE_REPORT_S:
            return []
        self._phases_said = True
        stuck_since, blocked_at, step = self._blocked
        out = []
        for rank in range(RANKS):
            where = (PendingPhase(step - 1, FORWARD, stuck_since) if rank == SLOW_RANK
                     else PendingPhase(step, BACKWARD, blocked_at))
            report = self._log(max(where.since, blocked_at) + PHASE_REPORT_S, rank, "WARNING",
                               f"step {where.step} has been in {where.phase} for {PHASE_REPORT_S:.0f} s")
            report.update(logger="jobsight.run", attrs=where.attrs())
            out.append((self.place(rank)[0], report))
        return out

    def _step_times(self, began: float, without: int | None = None) -> tuple[list[float], list[float]]:
        """Per rank: the step's duration and its forward time (arrival to backward start). ``without``:
        a rank that never finishes the step, so the others' pace is their own."""
        step_s = self.timings.step_s
        rng = self._random
        forward = [0.32 * step_s * rng.uniform(0.97, 1.03) for _ in range(RANKS)]
        forward[SLOW_RANK] *= self._slowdown(began)
        wait = [0.01 * step_s * rng.uniform(0.5, 1.5) for _ in range(RANKS)]
        # Backward and the all-reduce end together on every rank: the slowest rank sets the pace.
        slowest = max(w + f for r, (w, f) in enumerate(zip(wait, forward, strict=True)) if r != without)
        end = slowest + 0.67 * step_s * rng.uniform(0.98, 1.02)
        duration = [end + rng.uniform(0.0, 0.002) for _ in range(RANKS)]
        return duration, [round(f, 6) for f in forward]

    def _launch_logs(self, t: float) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for rank in range(RANKS):
            node, gpu = self.place(rank)
            start = self._log(t, rank, "INFO", f"rank {rank}/{RANKS} on {node} cuda:{gpu}: NCCL process "
                              f"group ready, {BATCH_PER_RANK} samples per step")
            # As the Lightning callback's fit_start says it: the collector learns each rank's GPU.
            start.update(logger="jobsight.run",
                         attrs={"event": "fit_start", "local_rank": gpu, "device": f"cuda:{gpu}"})
            out.append((node, start))
        return out

    def _log(self, t: float, rank: int, level: str, message: str) -> dict[str, Any]:
        node, _ = self.place(rank)
        return {"kind": "log", "job": self.job_id, "ts": us(t), "node": node, "rank": rank, "pid": self.pids[rank],
                "tid": self.pids[rank], "thread": "MainThread", "level": level, "logger": "train", "message": message}

    def _loss(self) -> float:
        return 2.1 + 7.0 * math.exp(-self._step / 900.0) + self._random.gauss(0.0, 0.05)

    def _step_records(self, began: float, duration: list[float], forward: list[float],
                      without: int | None = None) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        epoch = (self._step - 1) // STEPS_PER_EPOCH
        for rank in range(RANKS):
            if rank == without:
                continue
            node, _ = self.place(rank)
            wait = round(0.01 * self.timings.step_s, 6)
            out.append((node, {
                "kind": "step", "job": self.job_id, "ts": us(began + duration[rank]), "node": node, "rank": rank,
                "pid": self.pids[rank], "tid": self.pids[rank], "step": self._step, "epoch": epoch,
                "phase": "train", "duration_s": round(duration[rank], 6), "data_wait_s": wait,
                "compute_s": round(duration[rank] - wait, 6), "samples": BATCH_PER_RANK, "forward_s": forward[rank],
            }))
        end = began + duration[0]
        if self._step % 10 == 0:
            loss = self._loss()
            for name, value in (("train_loss", loss), ("lr", 3e-4 * min(1.0, self._step / 500.0))):
                out.append((NODES[0], {"kind": "metric", "job": self.job_id, "ts": us(end), "node": NODES[0],
                                       "rank": 0, "pid": self.pids[0], "tid": self.pids[0], "step": self._step,
                                       "name": name, "value": round(value, 6)}))
            if self._step % 100 == 0:
                rate = BATCH_PER_RANK * RANKS / duration[0]
                out.append((NODES[0], self._log(end, 0, "INFO", f"epoch {epoch} step {self._step}: loss {loss:.3f}, "
                                                                  f"{rate:,.0f} samples/s")))
        return out
