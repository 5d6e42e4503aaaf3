"""How a Slurm hook sends: one POST with a timeout of at most :data:`NET_TIMEOUT_S`, else an
fsynced append to the node daemon's spool; and a replay of that spool while time is left."""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any, Final

from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.outcomes import ACK, INGEST_PATH, REJECT, judge_status
from jobsight.protocol import wire

log = logging.getLogger("jobsight.slurm")

NET_TIMEOUT_S: Final = 1.0
ROOT_DATA_DIR: Final = "/var/lib/jobsight"


def spool_dir(settings: AgentSettings, env: dict[str, str]) -> str:
    """The node daemon's spool, so that it replays what a hook could not send."""
    if settings.spool_dir or env.get("JOBSIGHT_DATA_DIR") or os.geteuid() != 0:
        return settings.resolved_spool_dir()
    return os.path.join(ROOT_DATA_DIR, "spool")


class HookSender:
    """One short-lived sender: a POST with a ≤ 1 s timeout, else an fsynced spool append."""

    def __init__(self, settings: AgentSettings, token: str | None, spool: str, deadline: float):
        self.settings = settings
        self.token = token
        self.spool_path = spool
        self.deadline = deadline
        endpoint = settings.collector_endpoint()
        self._https, self._host, self._port = endpoint.https, endpoint.host, endpoint.port
        self._path = endpoint.prefix + INGEST_PATH
        self.reachable: bool | None = None
        """``None``: not tried yet; ``False``: the collector did not answer (or said 5xx)."""

    def _post(self, body: bytes) -> tuple[int, str]:
        """``(status, detail)``; status 0 for a network error or timeout.

        Plain HTTP/1.1 over a socket rather than ``http.client``: its imports (email,
        ssl) are a fifth of a hook's run time, and a hook sends one request.
        """
        timeout = max(0.05, min(NET_TIMEOUT_S, self.settings.http_timeout_s, self.deadline - time.monotonic()))
        port = self._port or (443 if self._https else 80)
        head = [f"POST {self._path} HTTP/1.1", f"Host: {self._host}:{port}", "Content-Type: application/json",
                "Content-Encoding: gzip", f"Content-Length: {len(body)}", "Connection: close"]
        if self.token:
            head.append(f"Authorization: Bearer {self.token}")
        try:
            with socket.create_connection((self._host, port), timeout=timeout) as raw:
                sock = raw
                if self._https:
                    import ssl

                    sock = ssl.create_default_context().wrap_socket(raw, server_hostname=self._host)
                sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
                answer = b""
                while len(answer) < 65536:
                    chunk = sock.recv(8192)
                    if not chunk:
                        break
                    answer += chunk
        except OSError as exc:
            return 0, f"{type(exc).__name__}: {exc}"
        status_line, _, rest = answer.partition(b"\r\n")
        parts = status_line.split()
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
            return 0, "not an HTTP answer"
        return int(parts[1]), rest.partition(b"\r\n\r\n")[2][:2000].decode("utf-8", "replace")

    def send(self, source: str, records: list[dict[str, Any]]) -> str:
        """Post one batch; returns ``sent``, ``refused`` (4xx, logged) or ``spooled``/``lost``."""
        body = wire.encode_batch(source, 0, records, self.settings.cluster)
        status, detail = self._post(body) if time.monotonic() < self.deadline else (0, "no time left")
        outcome = judge_status(status)
        if outcome == ACK:
            self.reachable = True
            return "sent"
        if outcome == REJECT:
            self.reachable = True
            log.warning("the collector refused %s (HTTP %d): %s", records[0]["kind"], status, detail[:500])
            return "refused"
        self.reachable = False
        log.warning("collector %s unavailable (%s); spooling %s", self.settings.url, detail or f"HTTP {status}",
                    records[0]["kind"])
        return "spooled" if self._spool(source, len(records), body) else "lost"

    def _spool(self, source: str, count: int, body: bytes) -> bool:
        from jobsight.agent.shipping.spool import Spool

        try:
            spool = Spool(self.spool_path, self.settings.spool_max_bytes)
        except OSError as exc:
            log.error("cannot open the spool %s: %s; record lost", self.spool_path, exc)
            return False
        try:
            ok = spool.append(source, 0, count, body)
        finally:
            spool.close()  # fsyncs and releases the segment for the daemon or the next hook
        if not ok:
            log.error("spool %s full or unwritable; record lost", self.spool_path)
        return ok

    def replay(self) -> int:
        """Send batches earlier hooks (or a dead daemon) left in the spool, oldest first, until
        the deadline; returns how many were acknowledged. Skipped when the collector is away."""
        if self.reachable is False or not os.path.isdir(self.spool_path):
            return 0
        from jobsight.agent.shipping.spool import Spool

        try:
            spool = Spool(self.spool_path, self.settings.spool_max_bytes)
        except OSError:
            return 0
        sent = 0
        try:
            spool.adopt()  # only segments nobody alive holds: never the daemon's own
            while time.monotonic() < self.deadline:
                batch = spool.peek()
                if batch is None:
                    break
                status, detail = self._post(batch.body)
                outcome = judge_status(status)
                if outcome == ACK:
                    spool.ack()
                    sent += 1
                elif outcome == REJECT:
                    log.warning("the collector refused spooled batch %s/%d (HTTP %d): %s",
                                batch.source, batch.seq, status, detail[:500])
                    spool.reject(batch, status, detail)
                else:
                    break
        finally:
            spool.close()
        return sent
