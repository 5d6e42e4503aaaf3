"""bench/cluster.py's load processes (bench/cluster_load.serve), driven over pipes."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import time
from collections.abc import Sequence
from typing import Any

from bench.cluster_load import LoadConfig, NodeSpec, TrainerSpec, serve


class LoadPool:
    """``procs`` load processes (bench/cluster_load.serve), driven over pipes."""

    def __init__(self, procs: int, config: LoadConfig) -> None:
        context = multiprocessing.get_context("spawn")  # no fork of this process's threads and sockets
        self._pipes: list[multiprocessing.connection.Connection] = []
        self.processes = []
        for index in range(procs):
            ours, theirs = context.Pipe()
            process = context.Process(target=serve, args=(theirs, config, index), name=f"load-{index}", daemon=True)
            process.start()
            self._pipes.append(ours)
            self.processes.append(process)
        self._next = 0

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]

    def _ask(self, messages: Sequence[tuple[Any, ...]], timeout: float = 300) -> list[Any]:
        for pipe, message in zip(self._pipes, messages, strict=True):
            pipe.send(message)
        answers = []
        deadline = time.monotonic() + timeout
        for pipe, process in zip(self._pipes, self.processes, strict=True):
            while not pipe.poll(1.0):
                if not process.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"load process {process.name} did not answer (exit code {process.exitcode})")
            _, answer = pipe.recv()
            answers.append(answer)
        return answers

    def add(self, nodes: list[NodeSpec], trainers: list[TrainerSpec]) -> None:
        """Spread the newcomers over the processes, round robin from where the last call stopped."""
        count = len(self._pipes)
        shares: list[tuple[list[NodeSpec], list[TrainerSpec]]] = [([], []) for _ in range(count)]
        for spec in nodes:
            shares[self._next % count][0].append(spec)
            self._next += 1
        for index, trainer in enumerate(trainers):
            shares[index % count][1].append(trainer)
        self._ask([("add", n, t) for n, t in shares])

    def mark(self) -> dict[str, Any]:
        return merge(self._ask([("mark",)] * len(self._pipes)))

    def stop(self, flush_timeout_s: float) -> dict[str, Any]:
        merged = merge(self._ask([("stop", flush_timeout_s)] * len(self._pipes), timeout=flush_timeout_s + 60))
        for process in self.processes:
            process.join(10)
        return merged


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {"post_times": [], "longest_spooled_s": 0.0, "flushed": True}
    for part in parts:
        for key, value in part.items():
            if key == "post_times":
                merged[key].extend(value)
            elif key == "longest_spooled_s":
                merged[key] = max(merged[key], value)
            elif key == "flushed":
                merged[key] = merged[key] and value
            else:
                merged[key] = merged.get(key, 0) + value
    return merged
