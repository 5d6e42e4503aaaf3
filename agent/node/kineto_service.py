"""Zero-code profiling: the node daemon answers PyTorch's own profiler (Kineto) on this node.

A PyTorch process started with ``KINETO_USE_DAEMON=1`` (the task prolog exports it) asks a
node-local endpoint for a profiling config every few seconds (:mod:`kineto_endpoint`,
:mod:`kineto_wire`), on its user's own socket (:mod:`kineto_sockets`). This module decides the
answers and collects what comes of them:

* **Whose process.** The kernel tells who sent each request (``SO_PASSCRED``): the sender's pid
  must be the first pid of its own request, its job is read from its Slurm cgroup (its
  environment only for a process outside Slurm: :mod:`kineto_process`), the job must be
  registered on this node, and the sender's uid must be the job's. Anything else gets "no
  config"; so does a request whose handling fails for any reason, at once (no pause: another
  process's answer is due within 0.1 s). Each uid gets at most :data:`~kineto_endpoint.RATE_PER_UID_S`
  datagrams answered a second; the rest are read and dropped, unparsed.
* **Only what the job asked for.** The job's open profile requests come from the collector
  (``GET /v1/directives`` with the job's own token, every 3 s, only for jobs whose processes
  poll). A process whose rank a pending request names gets one config: N optimizer iterations, its trace written into
  ``<trace dir>/<job>/``, a directory owned by the job's user, mode 0700. One trace at a time per
  process; the request is reported ``running``.
* **Reading the trace safely** (:mod:`kineto_traces`), on a thread of its own so that a large
  trace never delays an answer: the file is opened with ``O_NOFOLLOW`` and read only if it is a
  regular file owned by the job's uid, under the size cap; a round reads at most
  :data:`MAX_TRACES_PER_ROUND` traces and about the cap in bytes. It is parsed and summarised
  with the code that summarises callback profiles (top ops, time breakdown, diagnosis) and
  shipped as a ``profile`` record under the job, with rank and pid. A window that yields no trace
  in time, or a trace refused or failing to parse or summarise, fails the request with the
  reason, and its file is removed: a bad trace never holds up the windows behind it.
* **Saying it serves.** While serving, the answering thread rewrites the status file
  (:mod:`kineto_hooks`) every few seconds; the task prolog turns ``KINETO_USE_DAEMON`` on only
  while it is fresh.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from jobsight.agent.atomic_files import write_atomically
from jobsight.agent.node.kineto_endpoint import Credentials, EndpointBusy, Served, UidRateLimit
from jobsight.agent.node.kineto_hooks import STATUS_HEARTBEAT_S, status_path_for
from jobsight.agent.node.kineto_process import (
    RANK_VARIABLES,
    job_of_process,
    process_uid,
    rank_of,
    read_environ,
)
from jobsight.agent.node.kineto_sockets import SharedSocket, Sockets, UserSockets, wait_readable
from jobsight.agent.node.kineto_traces import (
    TraceRefused,
    Window,
    parse_trace,
    prepare_job_dir,
    prepare_trace_root,
    read_trace,
    remove_trace_files,
    trace_candidates,
    trace_path,
)
from jobsight.agent.node.kineto_wire import KinetoRequest
from jobsight.agent.node.registrations import Registration, read_registrations
from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.client import CollectorClient
from jobsight.agent.shipping.shipper import Shipper
from jobsight.agent.traces.profile_summary import breakdown, summarize_trace
from jobsight.agent.traces.trace_packing import pack_trace
from jobsight.protocol import diagnosis, wire

__all__ = ["RANK_VARIABLES", "KinetoService", "TraceRefused", "Window", "fallback_ms", "process_uid", "rank_of",
           "read_environ", "read_trace", "status_path", "write_status"]

log = logging.getLogger("jobsight.agent.kineto")

DIRECTIVE_POLL_S: Final = 3.0
ASKING_S: Final = 30.0
"""A job whose processes polled within this long is asked about at the collector (Kineto polls every 5 s)."""
WINDOW_TIMEOUT_S: Final = 120.0
"""A window that has written no readable trace this long after its config was handed out fails."""
MAX_FALLBACK_S: Final = 30
MAX_PROCESSES: Final = 100_000
SERVE_WAIT_S: Final = 0.2
"""The answering thread looks at the registrations (and its status) at least this often."""
DATAGRAMS_PER_TURN: Final = 32
"""Datagrams read from one socket before the next socket's turn: a flooded one cannot hold the thread."""
REGISTRATIONS_EVERY_S: Final = 2.0
"""The registrations are read again this often, and as soon as their directory changes."""
COLLECT_EVERY_S: Final = 0.5
MAX_TRACES_PER_ROUND: Final = 2
"""Traces read (and parsed) per collecting round; bytes are capped at about the trace cap too."""
ERROR_LOG_EVERY_S: Final = 60.0
"""A failing request is logged with its traceback at most this often (a user could repeat it)."""


@dataclass(frozen=True)
class PendingRequest:
    id: int
    steps: int
    ranks: tuple[int, ...] | None


@dataclass
class ServiceStatus:
    serving: bool = False
    message: str = "not started"
    configs_given: int = 0
    profiles_shipped: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    """Requests whose handling failed (answered "no config")."""
    traces_failed: int = 0


def status_path(settings: AgentSettings) -> Path:
    """The node daemon's status file, beside the registrations: ``/run/jobsight/agent-status.json``."""
    return status_path_for(settings.registration_dir)


def write_status(settings: AgentSettings, status: dict[str, Any], path: Path | None = None) -> None:
    """Write the daemon's status for admins (``cat /run/jobsight/agent-status.json``) and the task
    prolog (:func:`~kineto_hooks.kineto_serving`), stamped ``updated_at``; best effort."""
    path = path or status_path(settings)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps({**status, "updated_at": time.time()}, indent=2) + "\n", 0o644)
    except OSError as exc:
        log.warning("jobsight agent: cannot write %s: %s", path, exc)


def fallback_ms(steps: int) -> int:
    """The timed window of a loop without an optimizer: a second per step asked for, at most
    :data:`MAX_FALLBACK_S`."""
    return int(min(steps, MAX_FALLBACK_S) * 1000)


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


class KinetoService:
    """Three threads: one answers requests, one polls the collector for the jobs' profile
    requests and posts their states, one collects the traces. Every input is a parameter (tests
    run it as it runs)."""

    def __init__(
        self,
        settings: AgentSettings,
        shipper: Shipper,
        *,
        socket_name: str | None = None,
        trace_root: str | None = None,
        registration_dir: str | None = None,
        proc_root: str = "/proc",
        client: CollectorClient | None = None,
        clock: Callable[[], float] = time.monotonic,
        window_timeout_s: float = WINDOW_TIMEOUT_S,
        limit: UidRateLimit | None = None,
    ) -> None:
        self.settings = settings
        self.shipper = shipper
        self.socket_name = socket_name if socket_name is not None else settings.kineto_socket
        self.socket_dir = None if settings.kineto_uses_abstract_socket() else settings.kineto_socket_dir
        self.trace_root = Path(trace_root if trace_root is not None else settings.kineto_trace_dir)
        self.registration_dir = registration_dir or settings.registration_dir
        self.proc_root = proc_root
        self.client = client or CollectorClient(settings)
        self.clock = clock
        self.window_timeout_s = window_timeout_s
        self.limit = limit or UidRateLimit(clock=clock)
        self.status = ServiceStatus()
        self.status_file = status_path_for(self.registration_dir)
        self._sockets: Sockets | None = None
        self._pending: dict[str, list[PendingRequest]] = {}
        self._windows: dict[int, Window] = {}
        """In-flight windows by pid: one trace at a time per process (guarded by ``_lock``)."""
        self._polled: set[int] = set()
        """Processes that have polled before (a window is never given on a process's first poll)."""
        self._given: set[tuple[int, int]] = set()
        """(request id, pid) already handed a config: a request is run once per process."""
        self._registrations: dict[str, Registration] = {}
        self._registrations_seen: tuple[int, float] = (-1, -1e9)
        """(the directory's mtime, when) of the last read, by the answering thread."""
        self._polled_at = -1e9
        self._status_at = -1e9
        self._error_logged_at = -1e9
        self._lock = threading.Lock()
        self._reports: deque[tuple[str, int, str, str | None]] = deque()
        self._asking: dict[str, float] = {}
        """Jobs whose processes polled lately → when: the only ones the collector is asked about."""
        self._job_clients: dict[str, CollectorClient] = {}
        """Each running job's client, with the job's own token (see :meth:`_client_for`)."""
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

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

    def _load_registrations(self) -> dict[str, Registration]:
        registrations = {r.job_id: r for r in read_registrations(self.registration_dir)}
        with self._lock:
            self._registrations = registrations
        return registrations

    def _write_status(self) -> None:
        self._status_at = self.clock()
        status = dataclasses.asdict(self.status)
        status["rate_limited"] = {str(uid): n for uid, n in self.limit.dropped.items()}
        status["socket"] = self._sockets.address if self._sockets is not None else None
        write_status(self.settings, {"kineto": status}, self.status_file)

    def _log_error(self, what: str) -> None:
        """Log with the traceback at most every :data:`ERROR_LOG_EVERY_S` (a user can repeat the cause)."""
        now = self.clock()
        if now - self._error_logged_at >= ERROR_LOG_EVERY_S:
            self._error_logged_at = now
            log.exception("jobsight agent: %s (repeats are counted in the status file, not logged)", what)

    # -- the collector's requests -------------------------------------------------------------

    def _talk(self) -> None:
        while not self._stop.is_set():
            try:
                self._send_reports()
                self._refresh()
            except Exception:  # noqa: BLE001 - boundary: the collector's answers must not end the service
                log.exception("jobsight agent: profile request poll failed")
            self._stop.wait(0.5)

    def _refresh(self) -> None:
        now = self.clock()
        if now - self._polled_at < DIRECTIVE_POLL_S:
            return
        self._polled_at = now
        registrations = self._load_registrations()
        pending: dict[str, list[PendingRequest]] = {}
        self._forget_clients(registrations)
        with self._lock:
            asking = {job for job, at in self._asking.items() if now - at < ASKING_S}
            self._asking = {job: at for job, at in self._asking.items() if job in asking}
        # Only jobs whose processes poll us are asked about: a node's other jobs cost the collector nothing.
        for job, registration in registrations.items():
            if job in asking:
                pending[job] = self._pending_of(job, registration)
        with self._lock:
            self._pending = pending

    def _pending_of(self, job: str, registration: Registration) -> list[PendingRequest]:
        answer = self._client_for(registration).request("GET", "/v1/directives", query={"job": job})
        body = answer.json() if answer.status == 200 else None
        if not isinstance(body, dict):
            return []
        found = []
        for item in body.get("profile_requests", []):
            try:
                ranks = item.get("ranks")
                found.append(PendingRequest(int(item["id"]), int(item["steps"]),
                                            tuple(int(r) for r in ranks) if ranks is not None else None))
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
        return found

    def _client_for(self, registration: Registration | None) -> CollectorClient:
        """The job's own token (the prolog's token file, which only the job's user and root read)
        for its reads and reports: a node token may only write. Else the daemon's own client."""
        if registration is None or not registration.token_file:
            return self.client
        client = self._job_clients.get(registration.job_id)
        if client is None:
            try:
                with open(registration.token_file, encoding="ascii") as handle:
                    token = handle.read().strip()
            except (OSError, UnicodeDecodeError):
                return self.client
            client = CollectorClient(dataclasses.replace(self.settings, token=token))
            self._job_clients[registration.job_id] = client
        return client

    def _forget_clients(self, registrations: dict[str, Registration]) -> None:
        for job in [j for j in self._job_clients if j not in registrations]:
            self._job_clients.pop(job).close()

    def _report(self, job: str, request_id: int, state: str, reason: str | None = None) -> None:
        """Queue a state change for the other thread to post."""
        with self._lock:
            self._reports.append((job, request_id, state, reason))

    def _send_reports(self) -> None:
        while True:
            with self._lock:
                if not self._reports:
                    return
                job, request_id, state, reason = self._reports.popleft()
                registration = self._registrations.get(job)
            answer = self._client_for(registration).post_json(f"/v1/profile-requests/{request_id}/state",
                                                              {"state": state, "reason": reason})
            if answer.status not in (200, 409):
                log.warning("jobsight agent: could not report profile request %d %s (HTTP %d)", request_id, state,
                            answer.status)

    # -- answering a process ------------------------------------------------------------------

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

    def _give(self, job: str, pending: PendingRequest, rank: int, creds: Credentials) -> str | None:
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

    # -- collecting the traces ----------------------------------------------------------------

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
