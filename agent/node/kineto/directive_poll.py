"""The Kineto service's side of the collector: the jobs' open profile requests, and their states.

A job's open profile requests come from the collector (``GET /v1/directives`` with the job's own
token, through :mod:`jobsight.agent.shipping.directives`), every :data:`DIRECTIVE_POLL_S`, only for
jobs whose processes polled the service within :data:`ASKING_S`: a node's other jobs cost the
collector nothing. State changes the other threads queue (``running``, ``failed``) are posted from
here, so neither the answering thread nor the collecting one ever waits on the collector.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Final

from jobsight.agent.node.kineto.service_state import ServiceState
from jobsight.agent.node.registrations import Registration
from jobsight.agent.shipping.client import CollectorClient
from jobsight.agent.shipping.directives import ProfileRequest, fetch_profile_requests, post_request_state

log = logging.getLogger("jobsight.agent.kineto")

DIRECTIVE_POLL_S: Final = 3.0
ASKING_S: Final = 30.0
"""A job whose processes polled within this long is asked about at the collector (Kineto polls every 5 s)."""


class DirectivePolling(ServiceState):
    """The thread that talks to the collector (:meth:`_talk`)."""

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
        pending: dict[str, list[ProfileRequest]] = {}
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

    def _pending_of(self, job: str, registration: Registration) -> list[ProfileRequest]:
        _, requests = fetch_profile_requests(self._client_for(registration), job)
        return requests

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

    def _send_reports(self) -> None:
        while True:
            with self._lock:
                if not self._reports:
                    return
                job, request_id, state, reason = self._reports.popleft()
                registration = self._registrations.get(job)
            status = post_request_state(self._client_for(registration), request_id, state, reason)
            if status not in (200, 409):
                log.warning("jobsight agent: could not report profile request %d %s (HTTP %d)", request_id, state,
                            status)
