"""On-demand profiling: a cheap poll for requests, and state reports back.

One daemon thread per training process asks ``GET /v1/directives?job=…&rank=…``
every ``directive_poll_s`` seconds (3 s by default) and leaves the newest request
it has not taken yet in :attr:`DirectivePoller.pending`. The training thread only
reads that attribute at each step; when it starts a window it calls :meth:`take`,
and :meth:`report` queues a state change (``running``, ``failed``) that the thread
posts to ``POST /v1/profile-requests/{id}/state``. ``done`` is set by the collector
itself when the profile carrying the request id is stored. Both calls, and the
requests' shape, are :mod:`jobsight.agent.shipping.directives`'.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.client import CollectorClient
from jobsight.agent.shipping.directives import ProfileRequest, fetch_profile_requests, post_request_state

log = logging.getLogger("jobsight.agent.directives")


class DirectivePoller:
    """Polls for profile requests of ``job`` addressed to ``rank``; see the module docstring."""

    def __init__(self, settings: AgentSettings, job: str, rank: int | None, interval_s: float | None = None) -> None:
        self.settings = settings
        self.job = job
        self.rank = rank
        self.interval_s = interval_s if interval_s is not None else settings.directive_poll_s
        self.pending: ProfileRequest | None = None
        self.polls = 0
        self._taken: set[int] = set()
        self._reports: deque[tuple[int, str, str | None]] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client = CollectorClient(settings)
        self._warned = False

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="jobsight-directives", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Post the queued reports (within ``timeout``) and end the thread. Safe twice."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def take(self) -> ProfileRequest | None:
        """The pending request, now taken: it will not be offered again."""
        with self._lock:
            request, self.pending = self.pending, None
            if request is not None:
                self._taken.add(request.id)
            return request

    def report(self, request_id: int, state: str, reason: str | None = None) -> None:
        """Queue a state change for the poll thread to post; never blocks."""
        with self._lock:
            self._reports.append((request_id, state, reason))
        self._wake.set()

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                self._send_reports()
                if self._stop.is_set():
                    return
                self._poll()
                self._wake.wait(self.interval_s)
                self._wake.clear()
        except Exception:  # boundary: the poller dies quietly rather than crash the job
            log.exception("jobsight: directive poller stopped")
        finally:
            self._client.close()

    def _send_reports(self) -> None:
        while True:
            with self._lock:
                if not self._reports:
                    return
                request_id, state, reason = self._reports[0]
            status = self._said(post_request_state(self._client, request_id, state, reason))
            if status == 0 and not self._stop.is_set():
                return  # collector away: try again next round
            with self._lock:
                self._reports.popleft()

    def _poll(self) -> None:
        status, requests = fetch_profile_requests(self._client, self.job, self.rank)
        self._said(status)
        self.polls += 1
        for request in requests:
            with self._lock:
                if request.id not in self._taken and self.pending is None:
                    self.pending = request
                    return

    def _said(self, status: int) -> int:
        """``status``, once warned about when the collector refuses this job's token."""
        if status in (401, 403) and not self._warned:
            self._warned = True
            log.warning("jobsight: the collector refused directive polls (HTTP %d)", status)
        return status
