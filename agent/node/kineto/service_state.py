"""What the Kineto service's threads share: its inputs, the jobs, the pending requests, the windows.

:class:`~jobsight.agent.node.kineto.service.KinetoService` is one object whose jobs live in modules
of their own: answering Kineto (:mod:`~jobsight.agent.node.kineto.service`), deciding whose
process gets a config (:mod:`~jobsight.agent.node.kineto.deciding`), polling the collector
(:mod:`~jobsight.agent.node.kineto.directive_poll`) and collecting the traces
(:mod:`~jobsight.agent.node.kineto.trace_collection`). Each is a class over :class:`ServiceState`,
which holds what they share, guarded by one lock: every input is a parameter (tests run the
service as it runs).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Final

from jobsight.agent.node.kineto.endpoint import UidRateLimit
from jobsight.agent.node.kineto.heartbeat import ServiceStatus
from jobsight.agent.node.kineto.hooks import status_path_for
from jobsight.agent.node.kineto.sockets import Sockets
from jobsight.agent.node.kineto.traces import Window
from jobsight.agent.node.registrations import Registration, read_registrations
from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.client import CollectorClient
from jobsight.agent.shipping.directives import ProfileRequest
from jobsight.agent.shipping.shipper import Shipper

log = logging.getLogger("jobsight.agent.kineto")

WINDOW_TIMEOUT_S: Final = 120.0
"""A window that has written no readable trace this long after its config was handed out fails."""
ERROR_LOG_EVERY_S: Final = 60.0
"""A failing request is logged with its traceback at most this often (a user could repeat it)."""


class ServiceState:
    """The service's inputs and what its threads share; see the module docstring."""

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
        self._pending: dict[str, list[ProfileRequest]] = {}
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
        """Each running job's client, with the job's own token (see ``_client_for``)."""
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _load_registrations(self) -> dict[str, Registration]:
        registrations = {r.job_id: r for r in read_registrations(self.registration_dir)}
        with self._lock:
            self._registrations = registrations
        return registrations

    def _report(self, job: str, request_id: int, state: str, reason: str | None = None) -> None:
        """Queue a state change for the polling thread to post."""
        with self._lock:
            self._reports.append((job, request_id, state, reason))

    def _log_error(self, what: str) -> None:
        """Log with the traceback at most every :data:`ERROR_LOG_EVERY_S` (a user can repeat the cause)."""
        now = self.clock()
        if now - self._error_logged_at >= ERROR_LOG_EVERY_S:
            self._error_logged_at = now
            log.exception("jobsight agent: %s (repeats are counted in the status file, not logged)", what)
