"""Whose process gets a profiling config, and which: the answer to each Kineto request.

The kernel tells who sent each request (``SO_PASSCRED``): the sender's pid must be the first pid of
its own request, its job is read from its Slurm cgroup (its environment only for a process outside
Slurm: :mod:`jobsight.agent.node.kineto.process`), the job must be registered on this node, and the
sender's uid must be the job's. Anything else gets "no config"; so does a request whose handling
fails for any reason, at once (no pause: another process's answer is due within 0.1 s).

Only what the job asked for: a process whose rank one of the job's pending requests names
(:mod:`jobsight.agent.node.kineto.directive_poll`) gets one config: N optimizer iterations, its
trace written into ``<trace dir>/<job>/``, a directory owned by the job's user, mode 0700. One
trace at a time per process; the request is reported ``running``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Final

from jobsight.agent.node.kineto.endpoint import Credentials
from jobsight.agent.node.kineto.process import job_of_process, process_uid, rank_of, read_environ
from jobsight.agent.node.kineto.service_state import ServiceState
from jobsight.agent.node.kineto.traces import Window, prepare_job_dir, trace_path
from jobsight.agent.node.kineto.wire import KinetoRequest
from jobsight.agent.shipping.directives import ProfileRequest

log = logging.getLogger("jobsight.agent.kineto")

MAX_FALLBACK_S: Final = 30
MAX_PROCESSES: Final = 100_000


def fallback_ms(steps: int) -> int:
    """The timed window of a loop without an optimizer: a second per step asked for, at most
    :data:`MAX_FALLBACK_S`."""
    return int(min(steps, MAX_FALLBACK_S) * 1000)


class Deciding(ServiceState):
    """The service's answers; called by the answering thread for every request it reads."""

    def _refuse(self, why: str) -> None:
        self.status.refused[why] = self.status.refused.get(why, 0) + 1

    def decide_safely(self, request: KinetoRequest, creds: Credentials) -> str | None:
        """:meth:`decide`, with any failure answered as "no config" at once (and counted)."""
        try:
            return self.decide(request, creds)
        except Exception:  # noqa: BLE001 - boundary: whatever a process's /proc holds, the next request is answered
            self.status.errors += 1
            self._log_error(f"a profiler request of pid {creds.pid} failed; answered no config")
            return None

    def decide(self, request: KinetoRequest, creds: Credentials) -> str | None:
        """The config for the process that sent ``request``, or ``None``: nothing to do."""
        if request.kind != "req" or not request.wants_activities:
            return None  # a registration, or a process whose profiler is busy
        if not request.pids or request.pids[0] != creds.pid:
            self._refuse("pids not the sender's")
            return None
        env = read_environ(creds.pid, self.proc_root)
        with self._lock:
            registrations = self._registrations
        found = job_of_process(creds.pid, env, registrations, self.proc_root)
        if found.job is None:
            self._refuse(found.refusal)
            return None
        job = found.job
        registration = registrations[job]
        owner = process_uid(creds.pid, self.proc_root)
        if owner != creds.uid or (registration.uid is not None and registration.uid != creds.uid):
            self._refuse("uid not the job's")
            return None
        with self._lock:
            self._asking[job] = self.clock()
            pending_requests = list(self._pending.get(job, []))
            busy = creds.pid in self._windows
        if busy:
            return None  # one trace at a time per process
        if len(self._polled) > MAX_PROCESSES:
            self._polled.clear()  # pids of ended processes; a live one waits one more poll
        if creds.pid not in self._polled:
            # Its first poll comes while torch is imported, before any optimizer step: an
            # iteration window asked then is not counted (Kineto turns it into a short timed one).
            self._polled.add(creds.pid)
            return None
        rank = rank_of(env)
        for pending in pending_requests:
            if (pending.id, creds.pid) in self._given:
                continue
            if pending.ranks is not None and rank not in pending.ranks:
                continue
            return self._give(job, pending, rank, creds)
        return None

    def _give(self, job: str, pending: ProfileRequest, rank: int, creds: Credentials) -> str | None:
        self._given.add((pending.id, creds.pid))
        try:
            directory = prepare_job_dir(self.trace_root, job, creds.uid)
        except (OSError, ValueError) as exc:
            self._report(job, pending.id, "failed",
                         f"cannot prepare the trace directory on {self.settings.node}: {exc}")
            return None
        window = Window(pending.id, job, rank, creds.pid, creds.uid, directory, pending.steps, self.clock())
        with self._lock:
            self._windows[creds.pid] = window
        self.status.configs_given += 1
        self._report(job, pending.id, "running")
        log.info("jobsight agent: job %s rank %d pid %d: profiling %d steps (request %d)", job, rank, creds.pid,
                 pending.steps, pending.id)
        return "\n".join([
            f"ACTIVITIES_LOG_FILE={trace_path(window)}",
            "PROFILE_START_ITERATION=0",
            f"ACTIVITIES_ITERATIONS={pending.steps}",
            # A loop that never calls optimizer.step() counts no iterations: Kineto then traces
            # this long instead, from now (one second per step asked for).
            f"ACTIVITIES_DURATION_MSECS={fallback_ms(pending.steps)}",
            "ACTIVITIES_WARMUP_PERIOD_SECS=0",
        ])

    @staticmethod
    def _trace_path(window: Window) -> Path:
        return trace_path(window)
