"""Zero-code profiling: the node daemon answers PyTorch's own profiler (Kineto) on this node.

A PyTorch process started with ``KINETO_USE_DAEMON=1`` (the task prolog exports it) asks a
node-local endpoint for a profiling config every few seconds (:mod:`jobsight.agent.node.kineto.endpoint`,
:mod:`jobsight.agent.node.kineto.wire`), on its user's own socket
(:mod:`jobsight.agent.node.kineto.sockets`). :class:`KinetoService` runs three threads, each job
in a module of its own over the state they share (:mod:`jobsight.agent.node.kineto.service_state`):

* **Answering** (here): each readable socket gets a turn; every request is answered at once by
  :mod:`jobsight.agent.node.kineto.deciding` (whose process, and only what its job asked for).
  Each uid gets at most :data:`~jobsight.agent.node.kineto.endpoint.RATE_PER_UID_S` datagrams
  answered a second; the rest are read and dropped, unparsed.
* **Polling the collector** for the jobs' profile requests and posting their states
  (:mod:`jobsight.agent.node.kineto.directive_poll`).
* **Collecting the traces** (:mod:`jobsight.agent.node.kineto.trace_collection`), so that a large
  trace never delays an answer.

While serving, the answering thread also writes the heartbeat: the status file
(:mod:`jobsight.agent.node.kineto.heartbeat`) every few seconds; the task prolog turns
``KINETO_USE_DAEMON`` on only while it is fresh.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from typing import Final

from jobsight.agent.node.kineto.deciding import Deciding
from jobsight.agent.node.kineto.directive_poll import DirectivePolling
from jobsight.agent.node.kineto.endpoint import EndpointBusy, Served
from jobsight.agent.node.kineto.heartbeat import write_status
from jobsight.agent.node.kineto.hooks import STATUS_HEARTBEAT_S
from jobsight.agent.node.kineto.sockets import SharedSocket, Sockets, UserSockets, wait_readable
from jobsight.agent.node.kineto.trace_collection import TraceCollecting
from jobsight.agent.node.kineto.traces import prepare_trace_root
from jobsight.agent.node.registrations import Registration

log = logging.getLogger("jobsight.agent.kineto")

SERVE_WAIT_S: Final = 0.2
"""The answering thread looks at the registrations (and its status) at least this often."""
DATAGRAMS_PER_TURN: Final = 32
"""Datagrams read from one socket before the next socket's turn: a flooded one cannot hold the thread."""
REGISTRATIONS_EVERY_S: Final = 2.0
"""The registrations are read again this often, and as soon as their directory changes."""


class KinetoService(Deciding, DirectivePolling, TraceCollecting):
    """Three threads: one answers requests, one polls the collector for the jobs' profile
    requests and posts their states, one collects the traces. Every input is a parameter (tests
    run it as it runs): see :class:`~jobsight.agent.node.kineto.service_state.ServiceState`."""

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> bool:
        """Bind the endpoint(s) and start serving; ``False`` (and a warning) when another process
        (a site's Dynolog, another agent) holds the socket: this service steps aside, callbacks
        still work."""
        try:
            self._sockets = self._open_sockets()
        except EndpointBusy as exc:
            self.status.message = (f"stepped aside: {exc}; profiling without code changes is off on this node "
                                   "(the jobsight callbacks still profile on request)")
            log.warning("jobsight agent: %s", self.status.message)
            self._write_status()
            return False
        except (OSError, ValueError) as exc:
            self.status.message = f"off: cannot bind the profiler socket: {exc}"
            log.warning("jobsight agent: %s", self.status.message)
            self._write_status()
            return False
        self.status.serving = True
        self.status.message = f"serving PyTorch profiler requests on {self._sockets.address}"
        warning = self._prepare_trace_root()
        if warning:
            self.status.message += f"; warning: {warning}"
        log.info("jobsight agent: %s", self.status.message)
        # Kineto waits about 0.1 s for an answer: the thread that answers never waits on the
        # collector nor reads a trace; the others do.
        self._threads = [threading.Thread(target=self._serve, name="jobsight-kineto", daemon=True),
                         threading.Thread(target=self._talk, name="jobsight-kineto-requests", daemon=True),
                         threading.Thread(target=self._collect_loop, name="jobsight-kineto-traces", daemon=True)]
        for thread in self._threads:
            thread.start()
        return True

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)
        self._send_reports()
        if self._sockets is not None:
            self._sockets.close()
            self._sockets = None
            self.status.serving = False
            self.status.message = "stopped"
            self._write_status()  # at once: the task prolog stops pointing jobs here

    def _open_sockets(self) -> Sockets:
        if self.socket_dir is None:
            return SharedSocket(self.socket_name, self.limit)
        return UserSockets(self.socket_dir, self.socket_name, self.limit, self.clock)

    def _prepare_trace_root(self) -> str | None:
        try:
            return prepare_trace_root(self.trace_root)
        except OSError as exc:
            return f"cannot prepare {self.trace_root}: {exc}"

    # -- the answering thread -----------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                self._serve_round()
            except Exception:  # noqa: BLE001 - boundary: not a request's failure (those are answered), a bug of the loop
                self._log_error("profiler service round failed")
                self._stop.wait(0.1)

    def _serve_round(self) -> None:
        assert self._sockets is not None
        registrations = self._fresh_registrations()
        self._sockets.sync({r.uid for r in registrations.values() if r.uid is not None})
        # Each readable socket gets a turn of at most DATAGRAMS_PER_TURN: round-robin.
        for endpoint in wait_readable(self._sockets.endpoints(), SERVE_WAIT_S):
            for served in endpoint.serve_ready(self.decide_safely, DATAGRAMS_PER_TURN):
                self._note(served)
        if self.clock() - self._status_at >= STATUS_HEARTBEAT_S:
            self._write_status()

    def _note(self, served: Served) -> None:
        if served.error and served.error != "rate limited":
            log.debug("jobsight agent: profiler endpoint: %s", served.error)

    def _fresh_registrations(self) -> dict[str, Registration]:
        """The registrations, read again when their directory changed (a job starting here gets
        its user's socket within a round) or every :data:`REGISTRATIONS_EVERY_S`."""
        try:
            mtime = os.stat(self.registration_dir).st_mtime_ns
        except OSError:
            mtime = -1
        seen, at = self._registrations_seen
        now = self.clock()
        if mtime != seen or now - at >= REGISTRATIONS_EVERY_S:
            self._registrations_seen = (mtime, now)
            return self._load_registrations()
        with self._lock:
            return self._registrations

    # -- the heartbeat ------------------------------------------------------------------------

    def _write_status(self) -> None:
        self._status_at = self.clock()
        status = dataclasses.asdict(self.status)
        status["rate_limited"] = {str(uid): n for uid, n in self.limit.dropped.items()}
        status["socket"] = self._sockets.address if self._sockets is not None else None
        write_status(self.settings, {"kineto": status}, self.status_file)
