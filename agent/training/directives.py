"""On-demand profiling: a cheap poll for requests, and state reports back.

One daemon thread per training process asks ``GET /v1/directives?job=…&rank=…``
every ``directive_poll_s`` seconds (3 s by default) and leaves the newest request
it has not taken yet in :attr:`DirectivePoller.pending`. The training thread only
reads that attribute at each step; when it starts a window it calls :meth:`take`,
and :meth:`report` queues a state change (``running``, ``failed``) that the thread
posts to ``POST /v1/profile-requests/{id}/state``. ``done`` is set by the collector
itself when the profile carrying the request id is stored.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.client import CollectorClient

log = logging.getLogger("jobsight.agent.directives")


@dataclass(frozen=True)
class ProfileRequest:
    id: int
    steps: int
    ranks: tuple[int, ...] | None
    """``None`` means every rank."""


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
            path = f"/v1/profile-requests/{request_id}/state"
            status, _ = self._request("POST", path, {"state": state, "reason": reason})
            if status == 0 and not self._stop.is_set():
                return  # collector away: try again next round
            with self._lock:
                self._reports.popleft()

    def _poll(self) -> None:
        query = {"job": self.job}
        if self.rank is not None:
            query["rank"] = str(self.rank)
        status, body = self._request("GET", "/v1/directives", query=query)
        self.polls += 1
        if status != 200 or not isinstance(body, dict):
            return
        for item in body.get("profile_requests", []):
            try:
                request = ProfileRequest(
                    int(item["id"]), int(item["steps"]),
                    tuple(int(r) for r in item["ranks"]) if item.get("ranks") is not None else None,
                )
            except (KeyError, TypeError, ValueError):
                continue
            with self._lock:
                if request.id not in self._taken and self.pending is None:
                    self.pending = request
                    return

    def _request(self, method: str, path: str, payload: dict[str, Any] | None = None,
                 query: dict[str, str] | None = None) -> tuple[int, Any]:
        """``(status, parsed JSON)``; status 0 when the collector could not be reached."""
        if payload is not None:
            answer = self._client.post_json(path, payload)
        else:
            answer = self._client.request(method, path, query=query)
        if answer.status in (401, 403) and not self._warned:
            self._warned = True
            log.warning("jobsight: the collector refused directive polls (HTTP %d)", answer.status)
        return answer.status, answer.json()
