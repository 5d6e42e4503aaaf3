"""The load of bench/cluster.py: one process of simulated node daemons and training processes.

Each simulated node has the project's own :class:`~jobsight.agent.shipping.shipper.Shipper`
(its worker thread, queue, spool and connection) with the node daemon's settings, and sends
its 8 GPUs' ``gpu_sample`` records and one ``host_sample`` per tick, as ``jobsight agent``
does. One ticker thread per process makes every node's tick at its own phase of the second
(real nodes do not tick in step). Each simulated training process is a thread with a
:class:`~jobsight.agent.training.run_records.RunRecorder` (steps) and a
:class:`~jobsight.agent.training.logs.JobsightHandler` (log lines) on its own shipper, with
the agent's default settings.

The parent drives a process over a pipe: ``add`` nodes and trainers, ``mark`` (counters
and the post times since the last mark), ``stop`` (flush every shipper and report).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.client import CollectorClient
from jobsight.agent.shipping.outcomes import Outcome
from jobsight.agent.shipping.shipper import Shipper
from jobsight.agent.training.logs import JobsightHandler
from jobsight.agent.training.run_records import RunRecorder
from jobsight.protocol.records import GpuSample, HostSample
from jobsight.protocol.wire import now_us

GPUS = 8
SPOOLED_TOO_LONG_S = 10.0


@dataclass(frozen=True)
class NodeSpec:
    name: str
    job: str
    token: str
    spool_dir: str


@dataclass(frozen=True)
class TrainerSpec:
    name: str
    job: str
    node: str
    rank: int
    token: str
    spool_dir: str


@dataclass(frozen=True)
class LoadConfig:
    url: str
    batch_age_s: float
    """The node daemons' batch age; the training processes keep the agent's default."""
    train_hz: float
    http_timeout_s: float | None = None


# -- the shippers' post times (a timing wrapper: what is sent and how is the shipper's own) ------

_post_times: list[float] = []


def _time_posts() -> None:
    original: Callable[[CollectorClient, bytes], Outcome] = CollectorClient.post_batch

    def timed(self: CollectorClient, body: bytes) -> Outcome:
        started = time.perf_counter()
        try:
            return original(self, body)
        finally:
            _post_times.append(time.perf_counter() - started)  # list.append is atomic under the GIL

    CollectorClient.post_batch = timed  # type: ignore[method-assign]


# -- records ------------------------------------------------------------------------------

_GPU_FIELDS = [f.name for f in dataclasses.fields(GpuSample)]
_HOST_FIELDS = [f.name for f in dataclasses.fields(HostSample)]


class SimNode:
    """One node daemon: 8 GPUs working for one job, its own shipper."""

    def __init__(self, spec: NodeSpec, config: LoadConfig, rng: random.Random) -> None:
        settings = AgentSettings(url=config.url, token=spec.token, node=spec.name, spool_dir=spec.spool_dir,
                                 batch_age_s=config.batch_age_s)
        if config.http_timeout_s is not None:
            settings = dataclasses.replace(settings, http_timeout_s=config.http_timeout_s)
        self.spec = spec
        self.shipper = Shipper(settings)
        self.phase = rng.random()
        # Nodes added together would otherwise send their batches together, every batch age,
        # forever: real daemons start at scattered times, so their batch timers are spread.
        self.starts_at = time.monotonic() + rng.uniform(0.0, config.batch_age_s)
        self.gpu_records = 0
        self.host_records = 0
        self.spooled_since: float | None = None
        self._rng = rng
        seed = zlib.crc32(spec.name.encode())
        self._uuids = [f"GPU-{seed:08x}-{index:04x}-4c1e-9d7a-{index * 7919 + seed % 65536:012x}"
                       for index in range(GPUS)]
        self._energy = [rng.uniform(1e6, 1e8) for _ in range(GPUS)]
        self._cpu_time = rng.uniform(1e3, 1e5)

    def tick(self) -> None:
        ts = now_us()
        rng = self._rng
        busy = rng.random() > 0.05  # now and then a data stall on every GPU at once
        for index in range(GPUS):
            util = rng.uniform(85.0, 100.0) if busy else rng.uniform(0.0, 10.0)
            power = 150.0 + 5.5 * util + rng.uniform(-10.0, 10.0)
            self._energy[index] += power
            record = {
                "kind": "gpu_sample", "job": self.spec.job, "ts": ts, "node": self.spec.name,
                "gpu_index": index, "gpu_uuid": self._uuids[index], "gpu_name": "NVIDIA H100 80GB HBM3",
                "mig_uuid": None, "util_gpu": util, "util_mem": util * 0.45, "mem_used": 71 * 2**30 + index * 2**20,
                "mem_total": 80 * 2**30, "power_w": power, "energy_j": self._energy[index],
                "temp_c": 45.0 + util * 0.25, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619,
                "pcie_tx_kbs": rng.randrange(1000, 40000), "pcie_rx_kbs": rng.randrange(1000, 90000),
                "throttle_reasons": 0, "ecc_errors": 0, "process_count": 1,
                "sm_active": util * 0.9, "tensor_active": util * 0.6, "lost": False,
                # A healthy GPU's fault counters and flags, read every tick as the daemon does.
                "nvlink_crc_errors": 0, "nvlink_replay_errors": 0, "nvlink_recovery_errors": 0, "pcie_replays": 0,
                "remapped_rows_pending": False, "remap_failure": False, "retired_pages_pending": False,
            }
            self.shipper.enqueue(record)
        self.gpu_records += GPUS
        self._cpu_time += 12.0
        self.shipper.enqueue({"kind": "host_sample", "job": self.spec.job, "ts": ts, "node": self.spec.name,
                              "cpu_util": rng.uniform(600.0, 1200.0), "cpu_time_s": self._cpu_time,
                              "mem_used": 300 * 2**30, "mem_limit": 1024 * 2**30,
                              # The job's share of the node's power beside its GPUs (RAPL, cores split).
                              "energy_j": rng.uniform(150.0, 250.0), "power_source": "rapl",
                              "energy_split": "cores"})
        self.host_records += 1


def _check_record_shapes() -> None:
    """The simulated records carry exactly the wire fields (the protocol may have grown)."""
    node = SimNode(NodeSpec("shape", "shape", "", "/nonexistent"), LoadConfig("http://127.0.0.1:9", 1.0, 1.0),
                   random.Random(0))
    captured: list[dict[str, Any]] = []
    node.shipper.enqueue = captured.append  # type: ignore[method-assign,assignment]
    node.tick()
    common = {"kind", "job", "ts", "node"}
    assert set(captured[0]) - common == set(_GPU_FIELDS), set(captured[0]) ^ (set(_GPU_FIELDS) | common)
    assert set(captured[-1]) - common == set(_HOST_FIELDS)
    node.shipper.shutdown(0)


class Ticker(threading.Thread):
    """Ticks every node once a second at its own phase; a round that falls behind skips the
    ticks it missed (as the daemon does) and counts them."""

    def __init__(self, stop: threading.Event) -> None:
        super().__init__(name="sim-ticker", daemon=True)
        self._stop_event = stop
        self._lock = threading.Lock()
        self._nodes: list[SimNode] = []
        self.missed = 0

    def add(self, nodes: list[SimNode]) -> None:
        with self._lock:
            self._nodes = sorted(self._nodes + nodes, key=lambda n: n.phase)

    def run(self) -> None:
        round_start = time.monotonic()
        while not self._stop_event.is_set():
            with self._lock:
                nodes = self._nodes
            if not nodes:
                self._stop_event.wait(0.2)
                round_start = time.monotonic()
                continue
            for node in nodes:
                due = round_start + node.phase
                if due < node.starts_at:
                    continue
                delay = due - time.monotonic()
                if delay > 0 and self._stop_event.wait(delay):
                    return
                node.tick()
            round_start += 1.0
            behind = time.monotonic() - round_start
            if behind > 1.0:
                skipped = int(behind)
                self.missed += skipped * len(nodes)
                round_start += skipped


class Trainer(threading.Thread):
    """One training process: a step record and a log line ``train_hz`` times a second."""

    def __init__(self, spec: TrainerSpec, config: LoadConfig, stop: threading.Event) -> None:
        super().__init__(name=f"sim-{spec.name}", daemon=True)
        settings = AgentSettings(url=config.url, token=spec.token, node=spec.node, job_id=spec.job,
                                 spool_dir=spec.spool_dir)
        self.recorder = RunRecorder(settings, rank=spec.rank)
        self.logger = logging.getLogger(f"sim.{spec.name}")
        self.logger.propagate = False
        self.logger.setLevel(logging.INFO)
        self.logger.addHandler(JobsightHandler(settings=settings, shipper=self.recorder.shipper))
        self._period = 1.0 / config.train_hz
        self._stop_event = stop
        self.steps = 0
        self.logs = 0

    def run(self) -> None:
        rng = random.Random(self.name)
        next_at = time.monotonic()
        while not self._stop_event.is_set():
            wait = rng.uniform(0.0, 0.02)
            compute = self._period * rng.uniform(0.8, 0.95)
            self.recorder.step(self.steps, wait + compute, epoch=self.steps // 1000, data_wait_s=wait,
                               compute_s=compute, samples=256)
            self.logger.info("epoch %d step %d loss %.4f lr %.2e", self.steps // 1000, self.steps,
                             2.0 / (1 + self.steps / 500), 3e-4)
            self.steps += 1
            self.logs += 1
            next_at += self._period
            self._stop_event.wait(max(0.0, next_at - time.monotonic()))

    @property
    def shipper(self) -> Shipper:
        return self.recorder.shipper


class Load:
    """The nodes and trainers of one process."""

    def __init__(self, config: LoadConfig, seed: int) -> None:
        self.config = config
        self.stop_event = threading.Event()
        self.ticker = Ticker(self.stop_event)
        self.nodes: list[SimNode] = []
        self.trainers: list[Trainer] = []
        self._rng = random.Random(seed)
        self._longest_spooled = 0.0
        self._watch = threading.Thread(target=self._watch_spools, name="sim-watch", daemon=True)

    def start(self) -> None:
        self.ticker.start()
        self._watch.start()

    def add(self, nodes: list[NodeSpec], trainers: list[TrainerSpec]) -> None:
        made = [SimNode(spec, self.config, random.Random(self._rng.random())) for spec in nodes]
        self.nodes.extend(made)
        self.ticker.add(made)
        for spec in trainers:
            trainer = Trainer(spec, self.config, self.stop_event)
            self.trainers.append(trainer)
            trainer.start()

    def _shippers(self) -> list[Shipper]:
        return [n.shipper for n in self.nodes] + [t.shipper for t in self.trainers]

    def _watch_spools(self) -> None:
        """How long each node's shipper has had batches waiting in its spool, once a second."""
        while not self.stop_event.wait(1.0):
            now = time.monotonic()
            for node in list(self.nodes):
                if node.shipper.stats()["spool_pending"]:
                    if node.spooled_since is None:
                        node.spooled_since = now
                    self._longest_spooled = max(self._longest_spooled, now - node.spooled_since)
                else:
                    node.spooled_since = None

    def counters(self) -> dict[str, Any]:
        totals: dict[str, int] = {}
        for shipper in self._shippers():
            for key, value in shipper.stats().items():
                totals[key] = totals.get(key, 0) + value
        times = _post_times[:]
        del _post_times[: len(times)]
        return {
            **totals,
            "nodes": len(self.nodes),
            "trainers": len(self.trainers),
            "gpu_records": sum(n.gpu_records for n in self.nodes),
            "host_records": sum(n.host_records for n in self.nodes),
            "steps": sum(t.steps for t in self.trainers),
            "logs": sum(t.logs for t in self.trainers),
            "missed_ticks": self.ticker.missed,
            "longest_spooled_s": self._longest_spooled,
            "post_times": times,
        }

    def stop(self, flush_timeout_s: float) -> dict[str, Any]:
        self.stop_event.set()
        self.ticker.join(5)
        for trainer in self.trainers:
            trainer.join(5)
        deadline = time.monotonic() + flush_timeout_s
        flushed = all(s.flush(max(0.1, deadline - time.monotonic())) for s in self._shippers())
        for shipper in self._shippers():
            shipper.shutdown(1.0)
        return {**self.counters(), "flushed": flushed}


def serve(conn: Connection, config: LoadConfig, seed: int) -> None:
    """A load process's main: obey the parent's commands until ``stop``."""
    import resource

    # A node keeps one connection open: 1,000 nodes are 1,000 sockets.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    logging.basicConfig(level=logging.WARNING, format=f"load[{seed}] %(levelname)s %(name)s: %(message)s")
    # Every shipper says once that the collector is away: a thousand lines. The counters tell.
    logging.getLogger("jobsight").setLevel(logging.ERROR)
    _check_record_shapes()
    _time_posts()
    load = Load(config, seed)
    load.start()
    while True:
        command, *args = conn.recv()
        if command == "add":
            load.add(*args)
            conn.send(("ok", len(load.nodes)))
        elif command == "mark":
            conn.send(("ok", load.counters()))
        elif command == "stop":
            conn.send(("ok", load.stop(*args)))
            return
