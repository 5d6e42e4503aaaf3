"""In-process GPU sampling, for runs that no node daemon serves.

On a workstation, or a cluster without ``jobsight agent``, the training process
samples its own visible GPUs (``CUDA_VISIBLE_DEVICES`` mapped to NVML indices)
on a daemon thread and ships ``gpu_sample`` records under its job id. Only the
process with local rank 0 (or no rank) samples, so a node running N ranks does
not ship N copies. When the job has a registration file, the node daemon samples
it and nothing is started here.

Nothing here raises into the training code: NVML missing is one INFO line and
``None``; a failing tick is logged once and the thread carries on.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Final

from jobsight.agent.node.gpu.nvml import NvmlUnavailable
from jobsight.agent.node.gpu.sampler import NvmlSampler
from jobsight.agent.node.registrations import has_registration
from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.shipper import Shipper, get_shipper
from jobsight.agent.training.context import RunContext
from jobsight.protocol import wire

log = logging.getLogger("jobsight.agent.inprocess")

MIN_INTERVAL_S: Final = 0.5


class InProcessSampler:
    """A daemon thread that samples ``gpu_indices`` every ``interval_s`` until :meth:`stop`."""

    def __init__(
        self,
        context: RunContext,
        sampler: NvmlSampler,
        shipper: Shipper,
        gpu_indices: list[int],
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.context = context
        self.gpu_indices = list(gpu_indices)
        self.interval_s = max(MIN_INTERVAL_S, interval_s)
        self._sampler = sampler
        self._shipper = shipper
        self._clock = clock
        self._stop = threading.Event()
        self._pid = os.getpid()
        self._failed = False
        self.ticks = 0
        self._thread = threading.Thread(target=self._run, name="jobsight-gpu-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and os.getpid() == self._pid

    def tick(self) -> int:
        """One snapshot of the visible GPUs, queued; returns the number of records."""
        ts = wire.now_us()
        readings = self._sampler.sample(self.gpu_indices)
        for reading in readings:
            self._shipper.enqueue(
                {
                    "kind": "gpu_sample",
                    "job": self.context.job,
                    "ts": ts,
                    "node": self.context.node,
                    **reading.to_record(),
                }
            )
        return len(readings)

    def _run(self) -> None:
        next_at = self._clock()
        while not self._stop.is_set():
            try:
                self.tick()
                if self._failed:
                    log.info("jobsight: in-process GPU sampling works again")
                self._failed = False
            except Exception as exc:  # noqa: BLE001 - boundary: never disturb the training process
                if not self._failed:
                    log.warning("jobsight: in-process GPU sample failed (%s); retrying every tick", exc)
                self._failed = True
            self.ticks += 1
            next_at += self.interval_s
            now = self._clock()
            if next_at < now:  # overran (a stalled process): skip, do not bunch up
                next_at += (int((now - next_at) // self.interval_s) + 1) * self.interval_s
            self._stop.wait(next_at - now)
        self._sampler.close()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop sampling and release NVML; safe twice, and from a forked child (a no-op there)."""
        global _current
        self._stop.set()
        if os.getpid() != self._pid:
            return
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        with _lock:
            if _current is self:
                _current = None


_lock = threading.Lock()
_current: InProcessSampler | None = None
_logged: set[str] = set()


def _info_once(key: str, message: str, *args: object) -> None:
    if key not in _logged:
        _logged.add(key)
        log.info(message, *args)


def start_inprocess_sampler(
    settings: AgentSettings,
    context: RunContext,
    *,
    shipper: Shipper | None = None,
    environ: Mapping[str, str] | None = None,
) -> InProcessSampler | None:
    """Start sampling this process's visible GPUs, unless something else covers them.

    Returns the running sampler (the same one on later calls in this process), or
    ``None`` when nothing was started: a node daemon serves the job (its
    registration file exists), this is not local rank 0, NVML is not usable here,
    or no GPU is visible. ``shipper=None`` means the process-wide shipper;
    ``environ`` (default ``os.environ``) is where ``CUDA_VISIBLE_DEVICES`` is read.
    Never raises.
    """
    global _current
    try:
        with _lock:
            if _current is not None and _current.running:
                return _current
            if context.local_rank not in (None, 0):
                return None
            if has_registration(settings.registration_dir, context.job):
                _info_once("daemon", "jobsight: the node daemon samples the GPUs of job %s", context.job)
                return None
            env = os.environ if environ is None else environ
            sampler = NvmlSampler(settings.nvml_library)
            try:
                indices = sampler.visible_gpu_indices(env.get("CUDA_VISIBLE_DEVICES"))
            except NvmlUnavailable as exc:
                _info_once("nvml", "jobsight: no GPU sampling in this process: %s", exc)
                sampler.close()
                return None
            if not indices:
                _info_once("none", "jobsight: no visible GPU to sample")
                sampler.close()
                return None
            started = InProcessSampler(
                context,
                sampler,
                shipper if shipper is not None else get_shipper(settings),
                indices,
                settings.sample_interval_s,
            )
            started.start()
            _current = started
            return started
    except Exception:  # noqa: BLE001 - boundary: telemetry must never break the training script
        log.debug("jobsight: in-process GPU sampler not started", exc_info=True)
        return None
