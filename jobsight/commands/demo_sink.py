"""The local alert sink of ``jobsight up --demo``: where the demo's alerts go.

A small HTTP receiver on loopback for Apprise's JSON webhook (``json://127.0.0.1:<port>/alerts``,
configured as the collector's one alert sink, ``demo``): each message it gets is appended to a
log file and announced on the console in one line, so that a first-time user sees an alert
arrive when the simulated job's rank hangs, without setting up mail or chat.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

SINK_NAME: Final = "demo"
MAX_BODY: Final = 1024 * 1024


class DemoAlertSink:
    """Receives Apprise JSON webhook posts on ``127.0.0.1`` (a free port) until :meth:`stop`."""

    def __init__(self, log_path: Path, announce: Callable[[str], None] | None = None) -> None:
        self.log_path = log_path
        self.received = 0
        self._announce = announce
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the demo alert sink is not started")
        return int(self._server.server_address[1])

    @property
    def apprise_url(self) -> str:
        """The Apprise URL of this sink (no credentials: a loopback receiver)."""
        return f"json://127.0.0.1:{self.port}/alerts"

    def sink_setting(self) -> str:
        """``JOBSIGHT_ALERTS_SINKS``' value that sends every finding here."""
        return json.dumps([{"name": SINK_NAME, "url": self.apprise_url}])

    def start(self) -> None:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = min(int(self.headers.get("Content-Length") or 0), MAX_BODY)
                sink.record(self.rfile.read(length))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # one line per alert is ours to print, not one per request

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, name="jobsight-demo-alerts", daemon=True).start()

    def record(self, body: bytes) -> None:
        """Keep one message: appended to the log file, announced in one line."""
        try:
            message = json.loads(body)
        except ValueError:
            message = {"title": "(not JSON)", "message": body.decode("utf-8", "replace")}
        if not isinstance(message, dict):
            message = {"title": "(not an object)", "message": str(message)}
        title = str(message.get("title") or "").strip()
        text = str(message.get("message") or message.get("body") or "").strip()
        stamp = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %z")
        with self._lock:
            self.received += 1
            with open(self.log_path, "a", encoding="utf-8") as log:
                log.write(f"{stamp}  {title}\n{text}\n\n")
        if self._announce is not None:
            self._announce("alert: " + (title or (text.splitlines()[0] if text else "(empty message)")))

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
