"""The simulated cluster of ``jobsight up --demo``, run as ``python -m jobsight.commands.demo_cluster``.

Two simulated nodes, each with 8 simulated GPUs (:mod:`jobsight.agent.node.gpu.simulated`,
read like NVML) and a shipper of its own (the agent's real one: queue, batches, spool, the one
collector client), carry the job of :mod:`jobsight.commands.demo_story`. Every
``sample_interval_s`` (1 s) each node reads its GPUs and ships one ``gpu_sample`` per GPU, and
the ranks ship the steps, metrics and log lines they finished since the last tick.

The first run starts ``headstart_s`` in the past: its past is played through the same ticks at
once (records up to 7 days old are taken by the collector), then it goes on live. At its time
limit the run ends as ``timeout`` and, after ``restart_after_s``, the next one starts. SIGTERM
or SIGINT ends the current run as ``cancelled`` and exits once the shippers have drained.
Everything goes to cluster ``simulated``, named ``simulated: …`` and marked ``demo``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, Final

from jobsight.agent.node.gpu.simulated import SimulatedGpus
from jobsight.agent.settings import AgentSettings, load_agent_settings
from jobsight.agent.shipping.shipper import Shipper
from jobsight.collector.config.settings import SettingsError
from jobsight.commands.demo_settings import DemoSettings, load_demo_settings
from jobsight.commands.demo_story import CLUSTER, GPUS_PER_NODE, NODES, SLOW_RANK, SimulatedRun, us

log = logging.getLogger("jobsight.demo.cluster")

DRAIN_TIMEOUT_S: Final = 10.0
BATCH_AGE_S: Final = 1.0
"""A training process's batch age: the live page gets every second's samples."""


def job_id_at(start_s: float) -> str:
    """The id of the run that starts at ``start_s``: simulated, and unique per start."""
    return f"sim-{int(start_s)}"


class SimulatedCluster:
    """The simulated nodes: their GPUs, their shippers, and the run they carry."""

    def __init__(self, agent: AgentSettings, settings: DemoSettings,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self._clock = clock
        self._now = clock()
        self.gpus = {node: SimulatedGpus(node, GPUS_PER_NODE, clock=self._tick_time, seed=settings.seed + i)
                     for i, node in enumerate(NODES)}
        spool = os.path.join(agent.data_dir, "demo", "spool")
        self.shippers = {node: Shipper(dataclasses.replace(
            agent, cluster=CLUSTER, node=node, batch_age_s=BATCH_AGE_S, spool_dir=os.path.join(spool, node)))
            for node in NODES}
        self.runs = 0

    def _tick_time(self) -> float:
        return self._now

    def _ship(self, node: str, record: dict[str, Any]) -> None:
        self.shippers[node].enqueue(record)

    def start_run(self, job_id: str, start_s: float) -> SimulatedRun:
        run = SimulatedRun(job_id, start_s, self.settings.timings(), seed=self.settings.seed + self.runs)
        self.runs += 1
        for node, record in run.started():
            self._ship(node, record)
        log.info("run %s started at %s: healthy for %.0f s, then rank %d straggles for %.0f s and hangs until "
                 "the %.0f s time limit", job_id, time.strftime("%H:%M:%S", time.localtime(start_s)),
                 run.timings.healthy_s, SLOW_RANK, run.timings.straggler_s, run.timings.time_limit_s)
        return run

    def tick(self, run: SimulatedRun, t: float) -> None:
        """The nodes' GPU readings at ``t`` and what the ranks finished by then, queued for shipping."""
        self._now = t
        for rank, load in enumerate(run.loads(t)):
            node, gpu = run.place(rank)
            self.gpus[node].set_load(gpu, load)
        ts = us(t)
        for node, gpus in self.gpus.items():
            for reading in gpus.sample():
                self._ship(node, {"kind": "gpu_sample", "job": run.job_id, "ts": ts, "node": node,
                                  **reading.to_record()})
        for node, record in run.records_until(t):
            self._ship(node, record)

    def end_run(self, run: SimulatedRun, t: float, state: str) -> None:
        for node, record in run.ended(t, state):
            self._ship(node, record)
        log.info("run %s ended (%s)", run.job_id, state)

    def catch_up(self, run: SimulatedRun, until: float) -> float:
        """Play the run from its start to ``until`` at once; returns the next tick's time."""
        t = run.start_s
        while t < until:
            self.tick(run, t)
            t += self.settings.sample_interval_s
        return t

    def serve(self, stop: threading.Event, first_job_id: str | None = None) -> None:
        """Run the story until ``stop`` is set, one run after another."""
        interval = self.settings.sample_interval_s
        now = self._clock()
        start = now - self.settings.headstart_s
        run = self.start_run(first_job_id or job_id_at(start), start)
        next_at = self.catch_up(run, now)
        phase = run.phase(next_at)
        while not stop.is_set():
            if next_at >= run.end_s:
                self.end_run(run, run.end_s, "timeout")
                if stop.wait(self.settings.restart_after_s):
                    return
                start = self._clock()
                run = self.start_run(job_id_at(start), start)
                next_at = start
            self.tick(run, next_at)
            if run.phase(next_at) != phase:
                phase = run.phase(next_at)
                log.info("run %s: %s", run.job_id, phase if phase != "hung" else f"rank {SLOW_RANK} hangs")
            next_at += interval
            now = self._clock()
            if next_at < now:  # overran (a slow machine): skip the ticks missed rather than bunch them
                next_at += ((now - next_at) // interval + 1) * interval
            stop.wait(max(0.0, next_at - now))
        self.end_run(run, min(self._clock(), run.end_s), "cancelled")

    def close(self) -> bool:
        """Drain and stop the shippers; whether everything was delivered."""
        drained = all([shipper.flush(DRAIN_TIMEOUT_S) for shipper in self.shippers.values()])
        for shipper in self.shippers.values():
            shipper.shutdown(2.0)
        return drained


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobsight.commands.demo_cluster",
                                     description="the simulated cluster of `jobsight up --demo`")
    parser.add_argument("--first-job-id", help="job id of the first run (default sim-<its start time>)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        settings = load_demo_settings()
    except SettingsError as exc:
        print(f"jobsight demo cluster: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    cluster = SimulatedCluster(load_agent_settings(), settings)
    try:
        cluster.serve(stop, args.first_job_id)
    finally:
        if not cluster.close():
            log.warning("not everything was sent before exit; the rest waits in the spool")
    return 0


if __name__ == "__main__":
    sys.exit(main())
