"""Zero-code profiling: the node daemon answers PyTorch's own profiler (Kineto) on this node.

A PyTorch process started with ``KINETO_USE_DAEMON=1`` (the task prolog exports it) asks a
node-local endpoint for a profiling config every few seconds (:mod:`kineto_endpoint`,
:mod:`kineto_wire`). This module decides the answers and collects what comes of them:

* **Whose process.** The kernel tells who sent each request (``SO_PASSCRED``): the sender's pid
  must be the first pid of its own request, its job is read from its ``/proc/<pid>/environ``
  (``JOBSIGHT_JOB_ID``, else Slurm's variables), the job must be registered on this node, and
  the sender's uid must be the job's. Anything else gets "no config".
* **Only what the job asked for.** The job's open profile requests come from the collector
  (``GET /v1/directives`` with the job's own token, every 3 s, only for jobs whose processes
  poll). A process whose rank a pending request names gets one config: N optimizer iterations, its trace written into
  ``<trace dir>/<job>/``, a directory owned by the job's user, mode 0700. One trace at a time per
  process; the request is reported ``running``.
* **Reading the trace safely.** The file is opened with ``O_NOFOLLOW`` and read only if it is a
  regular file owned by the job's uid, under the size cap, and valid JSON; then summarised with
  the code that summarises callback profiles (top ops, time breakdown, diagnosis) and shipped as a
  ``profile`` record under the job, with rank and pid. A window that yields no trace in time, or
  a trace refused, fails the request with the reason.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import stat
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from jobsight.agent.atomic_files import write_atomically
from jobsight.agent.node.kineto_endpoint import Credentials, EndpointBusy, KinetoEndpoint
from jobsight.agent.node.kineto_wire import KinetoRequest
from jobsight.agent.node.registrations import Registration, read_registrations
from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.client import CollectorClient
from jobsight.agent.shipping.shipper import Shipper
from jobsight.agent.slurm.job import job_id_from_env
from jobsight.agent.training.profile_summary import breakdown, summarize_trace
from jobsight.agent.training.profiling import pack_trace
from jobsight.protocol import diagnosis, wire

log = logging.getLogger("jobsight.agent.kineto")

DIRECTIVE_POLL_S: Final = 3.0
ASKING_S: Final = 30.0
"""A job whose processes polled within this long is asked about at the collector (Kineto polls every 5 s)."""
WINDOW_TIMEOUT_S: Final = 120.0
"""A window that has written no readable trace this long after its config was handed out fails."""
MAX_ENVIRON_BYTES: Final = 256 * 1024
MAX_FALLBACK_S: Final = 30
MAX_PROCESSES: Final = 100_000
RANK_VARIABLES: Final = ("RANK", "SLURM_PROCID", "LOCAL_RANK")


@dataclass(frozen=True)
class PendingRequest:
    id: int
    steps: int
    ranks: tuple[int, ...] | None


@dataclass
class Window:
    """One trace asked of one process."""

    request_id: int
    job: str
    rank: int
    pid: int
    uid: int
    directory: Path
    steps: int
    given_at: float
    seen_size: int = -1


@dataclass
class ServiceStatus:
    serving: bool = False
    message: str = "not started"
    configs_given: int = 0
    profiles_shipped: int = 0
    refused: dict[str, int] = field(default_factory=dict)


def status_path(settings: AgentSettings) -> Path:
    """The node daemon's status file, beside the registrations: ``/run/jobsight/agent-status.json``."""
    return Path(settings.registration_dir).parent / "agent-status.json"


def write_status(settings: AgentSettings, status: dict[str, Any]) -> None:
    """Write the daemon's status for admins (``cat /run/jobsight/agent-status.json``); best effort."""
    path = status_path(settings)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(status, indent=2) + "\n", 0o644)
    except OSError as exc:
        log.warning("jobsight agent: cannot write %s: %s", path, exc)


class TraceRefused(Exception):
    """The trace file is not one the daemon may read; the message says why."""


def fallback_ms(steps: int) -> int:
    """The timed window of a loop without an optimizer: a second per step asked for, at most
    :data:`MAX_FALLBACK_S`."""
    return int(min(steps, MAX_FALLBACK_S) * 1000)


def read_environ(pid: int, proc_root: str = "/proc") -> dict[str, str]:
    """A process's environment (bounded); empty when it cannot be read."""
    try:
        with open(os.path.join(proc_root, str(pid), "environ"), "rb") as handle:
            raw = handle.read(MAX_ENVIRON_BYTES)
    except OSError:
        return {}
    env = {}
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep:
            env[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def process_uid(pid: int, proc_root: str = "/proc") -> int | None:
    try:
        return os.stat(os.path.join(proc_root, str(pid))).st_uid
    except OSError:
        return None


def rank_of(env: dict[str, str]) -> int:
    for name in RANK_VARIABLES:
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def read_trace(path: Path, uid: int, cap_bytes: int) -> bytes:
    """The trace's bytes, if it is a regular file (not a link) owned by ``uid``, at most
    ``cap_bytes``, and valid JSON; :class:`TraceRefused` says why not. ``FileNotFoundError``
    when it is not there yet."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise TraceRefused(f"cannot open the trace without following links: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TraceRefused("the trace is not a regular file")
        if info.st_uid != uid:
            raise TraceRefused(f"the trace is owned by uid {info.st_uid}, not the job's {uid}")
        if info.st_size > cap_bytes:
            raise TraceRefused(f"the trace is {info.st_size / 1e6:.1f} MB, over the cap of {cap_bytes / 1e6:.1f} MB")
        chunks = []
        left = cap_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        raw = b"".join(chunks)
    finally:
        os.close(fd)
    if len(raw) > cap_bytes:
        raise TraceRefused(f"the trace grew over the cap of {cap_bytes / 1e6:.1f} MB")
    return raw


class KinetoService:
    """The endpoint's thread: answers requests, polls the collector for the jobs' profile
    requests, and collects the traces. Every input is a parameter (tests run it as it runs)."""

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
    ) -> None:
        self.settings = settings
        self.shipper = shipper
        self.socket_name = socket_name if socket_name is not None else settings.kineto_socket
        self.socket_dir = settings.kineto_socket_dir
        self.trace_root = Path(trace_root if trace_root is not None else settings.kineto_trace_dir)
        self.registration_dir = registration_dir or settings.registration_dir
        self.proc_root = proc_root
        self.client = client or CollectorClient(settings)
        self.clock = clock
        self.window_timeout_s = window_timeout_s
        self.status = ServiceStatus()
        self._endpoint: KinetoEndpoint | None = None
        self._pending: dict[str, list[PendingRequest]] = {}
        self._windows: dict[int, Window] = {}
        """In-flight windows by pid: one trace at a time per process."""
        self._polled: set[int] = set()
        """Processes that have polled before (a window is never given on a process's first poll)."""
        self._given: set[tuple[int, int]] = set()
        """(request id, pid) already handed a config: a request is run once per process."""
        self._registrations: dict[str, Registration] = {}
        self._polled_at = -1e9
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
        """Bind the endpoint and start serving; ``False`` (and a warning) when another process
        (a site's Dynolog) holds the socket: this service steps aside, callbacks still work."""
        try:
            self._endpoint = KinetoEndpoint(self.socket_name, self.socket_dir)
        except EndpointBusy as exc:
            self.status.message = (f"stepped aside: {exc}; profiling without code changes is off on this node "
                                   "(the jobsight callbacks still profile on request)")
            log.warning("jobsight agent: %s", self.status.message)
            return False
        except OSError as exc:
            self.status.message = f"off: cannot bind the profiler socket: {exc}"
            log.warning("jobsight agent: %s", self.status.message)
            return False
        self.status.serving = True
        self.status.message = f"serving PyTorch profiler requests on {self._endpoint.address}"
        log.info("jobsight agent: %s", self.status.message)
        # Kineto waits about 0.1 s for an answer: the thread that answers never waits on the
        # collector; another one polls it and posts the state changes.
        self._threads = [threading.Thread(target=self._serve, name="jobsight-kineto", daemon=True),
                         threading.Thread(target=self._talk, name="jobsight-kineto-requests", daemon=True)]
        for thread in self._threads:
            thread.start()
        return True

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)
        self._send_reports()
        if self._endpoint is not None:
            self._endpoint.close()
            self._endpoint = None

    def _serve(self) -> None:
        assert self._endpoint is not None
        while not self._stop.is_set():
            try:
                served = self._endpoint.serve_once(0.5, self.decide)
                if served is not None and served.error:
                    log.debug("jobsight agent: profiler endpoint: %s", served.error)
                self._collect()
            except Exception:  # boundary: one bad round must not end the service
                log.exception("jobsight agent: profiler service round failed")
                self._stop.wait(1.0)

    def _talk(self) -> None:
        while not self._stop.is_set():
            try:
                self._send_reports()
                self._refresh()
            except Exception:  # boundary: the collector's answers must not end the service
                log.exception("jobsight agent: profile request poll failed")
            self._stop.wait(0.5)

    # -- the collector's requests -------------------------------------------------------------

    def _refresh(self) -> None:
        now = self.clock()
        if now - self._polled_at < DIRECTIVE_POLL_S:
            return
        self._polled_at = now
        registrations = {r.job_id: r for r in read_registrations(self.registration_dir)}
        pending: dict[str, list[PendingRequest]] = {}
        self._forget_clients(registrations)
        with self._lock:
            asking = {job for job, at in self._asking.items() if now - at < ASKING_S}
            self._asking = {job: at for job, at in self._asking.items() if job in asking}
        # Only jobs whose processes poll us are asked about: a node's other jobs cost the collector nothing.
        for job, registration in registrations.items():
            if job not in asking:
                continue
            answer = self._client_for(registration).request("GET", "/v1/directives", query={"job": job})
            body = answer.json() if answer.status == 200 else None
            if not isinstance(body, dict):
                continue
            found = []
            for item in body.get("profile_requests", []):
                try:
                    ranks = item.get("ranks")
                    found.append(PendingRequest(int(item["id"]), int(item["steps"]),
                                                tuple(int(r) for r in ranks) if ranks is not None else None))
                except (KeyError, TypeError, ValueError, AttributeError):
                    continue
            pending[job] = found
        with self._lock:
            self._registrations, self._pending = registrations, pending

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

    def decide(self, request: KinetoRequest, creds: Credentials) -> str | None:
        """The config for the process that sent ``request``, or ``None``: nothing to do."""
        if request.kind != "req" or not request.wants_activities:
            return None  # a registration, or a process whose profiler is busy
        if not request.pids or request.pids[0] != creds.pid:
            self._refuse("pids not the sender's")
            return None
        env = read_environ(creds.pid, self.proc_root)
        try:
            job = env.get("JOBSIGHT_JOB_ID") or job_id_from_env(env)
        except ValueError:
            self._refuse("not a job's process")
            return None
        with self._lock:
            registration = self._registrations.get(job)
            pending_requests = list(self._pending.get(job, []))
        if registration is None:
            self._refuse("job not registered here")
            return None
        owner = process_uid(creds.pid, self.proc_root)
        if owner != creds.uid or (registration.uid is not None and registration.uid != creds.uid):
            self._refuse("uid not the job's")
            return None
        with self._lock:
            self._asking[job] = self.clock()
        if creds.pid in self._windows:
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
            return self._give(job, registration, pending, rank, creds)
        return None

    def _give(self, job: str, registration: Registration, pending: PendingRequest, rank: int,
              creds: Credentials) -> str | None:
        directory = self.trace_root / job
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chown(directory, creds.uid, -1)
            os.chmod(directory, 0o700)
        except OSError as exc:
            self._report(job, pending.id, "failed",
                         f"cannot prepare the trace directory on {self.settings.node}: {exc}")
            self._given.add((pending.id, creds.pid))
            return None
        window = Window(pending.id, job, rank, creds.pid, creds.uid, directory, pending.steps, self.clock())
        self._windows[creds.pid] = window
        self._given.add((pending.id, creds.pid))
        self.status.configs_given += 1
        self._report(job, pending.id, "running")
        log.info("jobsight agent: job %s rank %d pid %d: profiling %d steps (request %d)", job, rank, creds.pid,
                 pending.steps, pending.id)
        return "\n".join([
            f"ACTIVITIES_LOG_FILE={self._trace_path(window)}",
            "PROFILE_START_ITERATION=0",
            f"ACTIVITIES_ITERATIONS={pending.steps}",
            # A loop that never calls optimizer.step() counts no iterations: Kineto then traces
            # this long instead, from now (one second per step asked for).
            f"ACTIVITIES_DURATION_MSECS={fallback_ms(pending.steps)}",
            "ACTIVITIES_WARMUP_PERIOD_SECS=0",
        ])

    @staticmethod
    def _trace_path(window: Window) -> Path:
        return window.directory / f"request{window.request_id}_rank{window.rank}_pid{window.pid}.json"

    # -- collecting the traces ----------------------------------------------------------------

    def _candidates(self, window: Window) -> list[Path]:
        """Where Kineto may have written the window's trace (it may add the pid to the name)."""
        base = self._trace_path(window)
        stem = base.name.removesuffix(".json")
        found = [base] + sorted(p for p in window.directory.glob(f"{stem}*.json") if p != base)
        return found

    def _collect(self) -> None:
        for pid, window in list(self._windows.items()):
            self._collect_one(pid, window)

    def _collect_one(self, pid: int, window: Window) -> None:
        with self._lock:
            registration = self._registrations.get(window.job)
        cap = min(self.settings.kineto_trace_cap_bytes, wire.MAX_TRACE_INFLATED)
        for path in self._candidates(window):
            try:
                size = os.lstat(path).st_size
            except FileNotFoundError:
                continue
            except OSError:
                size = -2
            if size != window.seen_size:  # still being written: look again next round
                window.seen_size = size
                return
            try:
                raw = read_trace(path, window.uid, cap)
                events = json.loads(raw).get("traceEvents")
                if not isinstance(events, list):
                    raise TraceRefused("the trace has no traceEvents list")
            except FileNotFoundError:
                continue
            except (TraceRefused, ValueError, AttributeError) as exc:
                self._finish(pid, window, f"trace refused: {exc}")
                return
            self._ship(window, raw, events, registration)
            self._finish(pid, window, None)
            return
        if self.clock() - window.given_at > self.window_timeout_s:
            self._finish(pid, window, f"no trace from pid {pid} within {self.window_timeout_s:.0f} s (did its loop "
                                      "call optimizer.step()? Kineto counts iterations there)")

    def _finish(self, pid: int, window: Window, failure: str | None) -> None:
        self._windows.pop(pid, None)
        for path in self._candidates(window):
            try:
                if stat.S_ISREG(os.lstat(path).st_mode) or os.path.islink(path):
                    os.unlink(path)
            except OSError:
                pass
        if failure is not None:
            log.warning("jobsight agent: job %s request %d: %s", window.job, window.request_id, failure)
            self._report(window.job, window.request_id, "failed", failure)

    def _ship(self, window: Window, raw: bytes, events: list[Any], registration: Registration | None) -> None:
        steps = window.steps
        summary = summarize_trace(events, steps)
        times = breakdown(events)
        summary["breakdown"] = times
        summary["device"] = "cuda" if times.get("basis") == "device" else "cpu"
        summary["source"] = "kineto"  # profiled without code changes, by the node daemon
        hints = diagnosis.diagnose(profile=summary)
        trace_b64, note = pack_trace(raw, wire.MAX_TRACE_B64)
        self.shipper.enqueue({
            "kind": "profile", "job": window.job, "ts": wire.now_us(), "node": self.settings.node,
            "rank": window.rank, "pid": window.pid, "profile_id": uuid.uuid4().hex, "request_id": window.request_id,
            "summary": summary, "diagnosis": hints, "trace_gz_b64": trace_b64, "note": note,
        })
        self.status.profiles_shipped += 1
        log.info("jobsight agent: job %s rank %d pid %d: profile shipped (request %d)", window.job, window.rank,
                 window.pid, window.request_id)
