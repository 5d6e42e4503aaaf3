"""The one HTTP client to the collector.

The shipper posts batches with it, the directive poller asks for profile requests and
reports their state, and ``jobsight report`` reads a job. The Slurm hooks send over a
leaner socket path of their own (:mod:`jobsight.agent.slurm.sender`); both judge answers
with :func:`~jobsight.agent.shipping.outcomes.judge_status`. After a ``retry`` outcome the
shipper calls :meth:`CollectorClient.back_off`: exponential with jitter, ``Retry-After``
honoured (up to ``MAX_RETRY_AFTER_S``), until an answer comes again.

One client is used from one thread (its keep-alive connection is not shared); a forked
child makes its own. Standard library only.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlencode

from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.outcomes import INGEST_PATH, RETRY, Outcome, judge_status

log = logging.getLogger("jobsight.agent.shipper")

MAX_RETRY_AFTER_S: Final = 300.0

@dataclass(frozen=True)
class Answer:
    """What came back: ``status`` 0 and ``error`` set when no answer came."""

    status: int
    body: bytes = b""
    retry_after: str | None = None
    error: str = ""

    def json(self) -> Any:
        """The parsed body; ``None`` when it is empty or not JSON."""
        try:
            return json.loads(self.body) if self.body else None
        except (ValueError, UnicodeDecodeError):
            return None

    def detail(self) -> str:
        """The collector's message: ``detail`` (or ``status`` on success) of its JSON answer."""
        parsed = self.json()
        if parsed is None:
            return self.error or self.body[:200].decode("utf-8", "replace")
        if isinstance(parsed, dict):
            value = parsed.get("detail", parsed.get("status", ""))
            return value if isinstance(value, str) else json.dumps(value)[:500]
        return ""


def _seconds(retry_after: str | None) -> float | None:
    if not retry_after:
        return None
    try:
        return max(0.0, float(retry_after))
    except ValueError:
        return None


class CollectorClient:
    """Requests to ``settings.url`` over one keep-alive connection, with the backoff state
    of the caller's retries. ``timeout_s`` overrides ``settings.http_timeout_s``."""

    def __init__(
        self,
        settings: AgentSettings,
        *,
        backoff_base_s: float = 1.0,
        backoff_max_s: float = 60.0,
        timeout_s: float | None = None,
    ) -> None:
        self.settings = settings
        self._backoff_base_s = backoff_base_s
        self._backoff_max_s = backoff_max_s
        self._timeout_s = timeout_s if timeout_s is not None else settings.http_timeout_s
        self._endpoint = settings.collector_endpoint()
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
            endpoint = self._endpoint
            connection = http.client.HTTPSConnection if endpoint.https else http.client.HTTPConnection
            self._conn = connection(endpoint.host, endpoint.port, timeout=self._timeout_s)
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

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        query: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        """One request to ``path`` under the collector URL; never raises for network trouble."""
        if self._token is None:
            self._token = self.settings.resolved_token()
        sent = {"Accept": "application/json", **(headers or {})}
        if self._token:
            sent["Authorization"] = f"Bearer {self._token}"
        target = self._endpoint.prefix + path + (f"?{urlencode(query)}" if query else "")
        for attempt in (0, 1):
            reused = self._conn is not None and self._conn.sock is not None
            try:
                conn = self._connection()
                conn.request(method, target, body=body, headers=sent)
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if reused and attempt == 0:
                    continue  # the server closed an idle keep-alive connection: one fresh try
                return Answer(0, error=f"{type(exc).__name__}: {exc}")
            if response.will_close:
                self.close()
            if response.status in (401, 403):
                self._token = None  # a token file may be replaced; read it again next time
            return Answer(response.status, data, response.getheader("Retry-After"))
        return Answer(0, error="connection lost")

    def post_json(self, path: str, payload: Any) -> Answer:
        return self.request("POST", path, body=json.dumps(payload).encode(),
                            headers={"Content-Type": "application/json"})

    def post_batch(self, body: bytes) -> Outcome:
        """Send one gzip batch to ``/v1/ingest`` and judge the answer; never raises for network trouble."""
        answer = self.request("POST", INGEST_PATH, body=body,
                              headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        kind = judge_status(answer.status)
        if kind != RETRY:
            self._recovered()
            return Outcome(kind, answer.status, answer.detail())
        detail = answer.detail() if answer.status else answer.error
        return Outcome(RETRY, answer.status, detail or f"HTTP {answer.status}", _seconds(answer.retry_after))
