"""The shipper's line to the collector: one keep-alive POST to ``/v1/ingest`` at a time.

Each answer is judged as one of three outcomes:

* ``ack``: 200 (``stored`` or ``duplicate``);
* ``reject``: a 4xx the collector will always give for this batch;
* ``retry``: 5xx, 408, 429 or a network error. The caller then calls
  :meth:`CollectorClient.back_off`: exponential with jitter, ``Retry-After``
  honoured (up to ``MAX_RETRY_AFTER_S``), until an answer comes again.

Used from the shipper's worker thread only; a forked child makes its own.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import logging
import random
import time
from dataclasses import dataclass
from typing import Final

from jobsight.agent.settings import AgentSettings

log = logging.getLogger("jobsight.agent.shipper")

MAX_RETRY_AFTER_S: Final = 300.0
REJECT_STATUSES: Final = frozenset({400, 401, 403, 404, 405, 409, 410, 411, 413, 415, 422})

ACK: Final = "ack"
REJECT: Final = "reject"
RETRY: Final = "retry"


@dataclass(frozen=True)
class Outcome:
    kind: str
    """:data:`ACK`, :data:`REJECT` or :data:`RETRY`."""
    status: int = 0
    """The HTTP status; 0 when no answer came."""
    detail: str = ""
    retry_after: float | None = None
    """Seconds from ``Retry-After``; ``None`` when absent or unreadable."""


class CollectorClient:
    """Posts gzip batches to ``settings.url`` and keeps the backoff state between attempts."""

    def __init__(self, settings: AgentSettings, *, backoff_base_s: float, backoff_max_s: float) -> None:
        self.settings = settings
        self._backoff_base_s = backoff_base_s
        self._backoff_max_s = backoff_max_s
        endpoint = settings.ingest_endpoint()
        self._https, self._host, self._port, self._path = endpoint.https, endpoint.host, endpoint.port, endpoint.path
        self._conn: http.client.HTTPConnection | None = None
        self._token: str | None = None
        self.backoff_until = 0.0
        """``time.monotonic()`` before which nothing should be posted; 0.0 when not backing off."""
        self._failures = 0

    def set_token(self, token: str) -> None:
        """Use ``token`` from the next request on."""
        self.settings = dataclasses.replace(self.settings, token=token)
        self._token = token

    # -- backoff -----------------------------------------------------------------------

    def in_backoff(self) -> bool:
        return time.monotonic() < self.backoff_until

    def back_off(self, outcome: Outcome) -> None:
        """Wait longer before the next attempt, after a ``retry`` outcome."""
        self._failures += 1
        ceiling = min(self._backoff_max_s, self._backoff_base_s * 2 ** min(self._failures - 1, 30))
        delay = random.uniform(ceiling / 2, ceiling)
        if outcome.retry_after is not None:
            delay = max(delay, min(outcome.retry_after, MAX_RETRY_AFTER_S))
        self.backoff_until = time.monotonic() + delay
        if self._failures == 1:
            log.warning(
                "jobsight: collector %s unavailable (%s); spooling and retrying",
                self.settings.url,
                outcome.detail or f"HTTP {outcome.status}",
            )

    def _recovered(self) -> None:
        if self._failures:
            log.info("jobsight: collector %s reachable again", self.settings.url)
        self._failures = 0
        self.backoff_until = 0.0

    # -- HTTP --------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            timeout = self.settings.http_timeout_s
            if self._https:
                self._conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout)
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        return self._conn

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - boundary: closing a broken socket is best-effort
                pass

    def abandon(self) -> None:
        """In a forked child: forget the parent's socket."""
        self._conn = None  # the parent's socket: dropped, never closed on its behalf

    def post(self, body: bytes) -> Outcome:
        """Send one gzip batch and judge the answer; never raises for network trouble."""
        if self._token is None:
            self._token = self.settings.resolved_token()
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        for attempt in (0, 1):
            reused = self._conn is not None and self._conn.sock is not None
            try:
                conn = self._connection()
                conn.request("POST", self._path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if reused and attempt == 0:
                    continue  # the server closed an idle keep-alive connection: one fresh try
                return Outcome(RETRY, detail=f"{type(exc).__name__}: {exc}")
            if response.will_close:
                self.close()
            return self._judge(response.status, data, response.getheader("Retry-After"))
        return Outcome(RETRY, detail="connection lost")

    def _judge(self, status: int, data: bytes, retry_after: str | None) -> Outcome:
        detail = _detail(data)
        if status == 200:
            self._recovered()
            return Outcome(ACK, status, detail)
        if status in (401, 403):
            self._token = None  # a token file may be replaced; read it again next time
        if status in REJECT_STATUSES or (400 <= status < 500 and status not in (408, 429)):
            self._recovered()
            return Outcome(REJECT, status, detail)
        after: float | None = None
        if retry_after:
            try:
                after = max(0.0, float(retry_after))
            except ValueError:
                after = None
        return Outcome(RETRY, status, detail or f"HTTP {status}", after)


def _detail(data: bytes) -> str:
    """The collector's message: ``detail`` (or ``status`` on success) of its JSON answer."""
    try:
        parsed = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return data[:200].decode("utf-8", "replace")
    if isinstance(parsed, dict):
        value = parsed.get("detail", parsed.get("status", ""))
        return value if isinstance(value, str) else json.dumps(value)[:500]
    return ""
