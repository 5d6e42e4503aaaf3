"""Collecting the traces of the Kineto service's windows, on a thread of their own.

A large trace never delays an answer: this thread reads them (:mod:`jobsight.agent.node.kineto.traces`:
opened with ``O_NOFOLLOW``, read only if it is a regular file owned by the job's uid, under the size
cap), at most :data:`MAX_TRACES_PER_ROUND` traces and about the cap in bytes a round. A trace is
parsed and summarised with the code that summarises callback profiles (top ops, time breakdown,
diagnosis) and shipped as a ``profile`` record under the job, with rank and pid. A window that
yields no trace in time, or a trace refused or failing to parse or summarise, fails the request
with the reason, and its file is removed: a bad trace never holds up the windows behind it.
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from jobsight.agent.node.kineto.service_state import ServiceState
from jobsight.agent.node.kineto.traces import (
    TraceRefused,
    Window,
    parse_trace,
    read_trace,
    remove_trace_files,
    trace_candidates,
)
from jobsight.agent.node.registrations import Registration
from jobsight.agent.traces.profile_summary import breakdown, summarize_trace
from jobsight.agent.traces.trace_packing import pack_trace
from jobsight.protocol import diagnosis, wire

log = logging.getLogger("jobsight.agent.kineto")

COLLECT_EVERY_S: Final = 0.5
MAX_TRACES_PER_ROUND: Final = 2
"""Traces read (and parsed) per collecting round; bytes are capped at about the trace cap too."""


@dataclass
class ReadBudget:
    """What one collecting round may still read."""

    traces: int
    bytes: int
    read: int = 0

    def allows(self, size: int) -> bool:
        # The round's first trace is always read (the cap bounds it); later ones must fit.
        return self.traces > 0 and (self.read == 0 or size <= self.bytes - self.read)

    def spend(self, size: int) -> None:
        self.traces -= 1
        self.read += size


class TraceCollecting(ServiceState):
    """The thread that collects the traces (:meth:`_collect_loop`)."""

    def _collect_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._collect()
            except Exception:  # noqa: BLE001 - boundary: a bug here must not end the service (each trace has its own)
                log.exception("jobsight agent: collecting profiler traces failed")
            self._stop.wait(COLLECT_EVERY_S)

    def _collect(self) -> None:
        """One round over the windows, reading at most :data:`MAX_TRACES_PER_ROUND` traces and
        about the cap in bytes; the rest wait for the next round."""
        budget = ReadBudget(MAX_TRACES_PER_ROUND, self._cap())
        with self._lock:
            windows = list(self._windows.items())
        for pid, window in windows:
            if not self._collect_one(pid, window, budget):
                return

    def _cap(self) -> int:
        return min(self.settings.kineto_trace_cap_bytes, wire.MAX_TRACE_INFLATED)

    def _collect_one(self, pid: int, window: Window, budget: ReadBudget | None = None) -> bool:
        """Look at one window's trace; ``False`` when the round's budget is spent."""
        budget = budget or ReadBudget(1, self._cap())
        for path in trace_candidates(window):
            try:
                size = os.lstat(path).st_size
            except FileNotFoundError:
                continue
            except OSError:
                size = -2
            if size != window.seen_size:  # still being written: look again next round
                window.seen_size = size
                return True
            if not budget.allows(size):
                return False
            budget.spend(max(size, 0))
            self._take(pid, window, path)
            return True
        if self.clock() - window.given_at > self.window_timeout_s:
            self._finish(pid, window, f"no trace from pid {pid} within {self.window_timeout_s:.0f} s (did its loop "
                                      "call optimizer.step()? Kineto counts iterations there)")
        return True

    def _take(self, pid: int, window: Window, path: Path) -> None:
        """Read, parse, summarise and ship one trace; any failure ends the window as failed."""
        with self._lock:
            registration = self._registrations.get(window.job)
        try:
            raw = read_trace(path, window.uid, self._cap())
            events = parse_trace(raw)
            record = self._profile_record(window, raw, events, registration)
        except FileNotFoundError:
            return  # removed since it was seen: the window goes on until its timeout
        except TraceRefused as exc:
            self._finish(pid, window, f"trace refused: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - boundary: whatever a user-written trace holds ends only its window
            self._finish(pid, window, f"trace could not be summarised: {type(exc).__name__}: {exc}"[:500])
            return
        self.shipper.enqueue(record)
        self.status.profiles_shipped += 1
        log.info("jobsight agent: job %s rank %d pid %d: profile shipped (request %d)", window.job, window.rank,
                 window.pid, window.request_id)
        self._finish(pid, window, None)

    def _finish(self, pid: int, window: Window, failure: str | None) -> None:
        with self._lock:
            if self._windows.get(pid) is window:
                del self._windows[pid]
        remove_trace_files(window)
        if failure is not None:
            self.status.traces_failed += 1
            log.warning("jobsight agent: job %s request %d: %s", window.job, window.request_id, failure)
            self._report(window.job, window.request_id, "failed", failure)

    def _profile_record(self, window: Window, raw: bytes, events: list[dict[str, Any]],
                        registration: Registration | None) -> dict[str, Any]:
        summary = summarize_trace(events, window.steps)
        times = breakdown(events)
        summary["breakdown"] = times
        summary["device"] = "cuda" if times.get("basis") == "device" else "cpu"
        summary["source"] = "kineto"  # profiled without code changes, by the node daemon
        hints = diagnosis.diagnose(profile=summary)
        trace_b64, note = pack_trace(raw, wire.MAX_TRACE_B64)
        return {
            "kind": "profile", "job": window.job, "ts": wire.now_us(), "node": self.settings.node,
            "rank": window.rank, "pid": window.pid, "profile_id": uuid.uuid4().hex, "request_id": window.request_id,
            "summary": summary, "diagnosis": hints, "trace_gz_b64": trace_b64, "note": note,
        }
