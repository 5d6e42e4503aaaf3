"""The Redfish node-power source against a real HTTPS server on 127.0.0.1 (stdlib ``http.server``
over ``ssl``, in a thread) with a certificate made by the ``openssl`` CLI, and Basic auth."""

from __future__ import annotations

import base64
import json
import logging
import socket
import ssl
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from jobsight.agent.node.power.reader import BackgroundPowerReader, PowerReadError
from jobsight.agent.node.power.redfish import RedfishReader, RedfishTarget

USER = "admin"
PASSWORD = "s3cret:Pw-42"  # a colon in it: the file's line splits at the first one
WRONG = "not-the-Pw-17"
CHASSIS = {"Members": [{"@odata.id": "/redfish/v1/Chassis/1"}]}
HANG = object()
"""A route that accepts the request and never answers."""


@dataclass(frozen=True)
class Cert:
    cert: str
    key: str


def make_cert(where: Path, name: str) -> Cert:
    cert, key = where / f"{name}.crt", where / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-days", "1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return Cert(str(cert), str(key))


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Cert]:
    where = tmp_path_factory.mktemp("certs")
    return {"bmc": make_cert(where, "bmc"), "other": make_cert(where, "other")}


class FakeBMC:
    """A Redfish service: ``routes`` maps a path to its JSON (or bytes, or :data:`HANG`); every
    request needs ``USER``/``PASSWORD``. ``hits`` counts the requests per path."""

    def __init__(self, cert: Cert, routes: dict[str, Any]) -> None:
        self.routes = routes
        self.hits: Counter[str] = Counter()
        self.release = threading.Event()
        self.authorization = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        bmc = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 10

            def do_GET(self) -> None:
                bmc.hits[self.path] += 1
                if self.headers.get("Authorization") != bmc.authorization:
                    self.answer(401, b'{"error": "unauthorized"}', {"WWW-Authenticate": 'Basic realm="Redfish"'})
                    return
                body = bmc.routes.get(self.path)
                if body is HANG:
                    bmc.release.wait(10)
                    return
                if body is None:
                    self.answer(404, b'{"error": "not found"}')
                elif isinstance(body, bytes):
                    self.answer(200, body)
                else:
                    self.answer(200, json.dumps(body).encode())

            def answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that rejects the certificate ends its handshake here

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert.cert, cert.key)
        self.server = Server(("127.0.0.1", 0), Handler)
        # The handshake is made in the request's thread, so a bad client cannot stall the accepting one.
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True, do_handshake_on_connect=False)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve(certs: dict[str, Cert]) -> Iterator[Any]:
    started: list[FakeBMC] = []

    def start(routes: dict[str, Any], cert: str = "bmc") -> FakeBMC:
        bmc = FakeBMC(certs[cert], routes)
        started.append(bmc)
        return bmc

    yield start
    for bmc in started:
        bmc.close()


def credentials(tmp_path: Path, password: str = PASSWORD) -> str:
    path = tmp_path / "bmc.credentials"
    path.write_text(f"{USER}:{password}\n")
    path.chmod(0o600)
    return str(path)


def test_reads_power_and_environment_metrics(serve: Any, certs: dict[str, Cert], tmp_path: Path) -> None:
    power = {"PowerControl": [{"PowerConsumedWatts": 1234.5, "PowerCapacityWatts": 3000}]}
    bmc = serve({"/redfish/v1/Chassis": CHASSIS, "/redfish/v1/Chassis/1/Power": power})
    reader = RedfishReader(RedfishTarget(bmc.url, credentials(tmp_path), ca_file=certs["bmc"].cert))
    assert reader.power_w() == 1234.5
    power["PowerControl"][0]["PowerConsumedWatts"] = 987
    assert reader.power_w() == 987.0
    assert bmc.hits["/redfish/v1/Chassis"] == 1  # discovered once

    newer = serve({"/redfish/v1/Chassis": {"Members": [{"@odata.id": "/redfish/v1/Chassis/HGX_0"}]},
                   "/redfish/v1/Chassis/HGX_0/EnvironmentMetrics": {"PowerWatts": {"Reading": 812.25}}})
    reader = RedfishReader(RedfishTarget(newer.url, credentials(tmp_path), ca_file=certs["bmc"].cert))
    assert reader.power_w() == 812.25
    assert reader.power_w() == 812.25
    assert newer.hits["/redfish/v1/Chassis/HGX_0/Power"] == 1  # the 404 is not asked again

    named = RedfishReader(RedfishTarget(bmc.url, credentials(tmp_path), ca_file=certs["bmc"].cert, chassis="1"))
    assert named.power_w() == 987.0
    assert bmc.hits["/redfish/v1/Chassis"] == 1


def test_wrong_password_is_refused_and_said_once(serve: Any, certs: dict[str, Cert], tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    bmc = serve({"/redfish/v1/Chassis": CHASSIS,
                 "/redfish/v1/Chassis/1/Power": {"PowerControl": [{"PowerConsumedWatts": 640}]}})
    creds = credentials(tmp_path, WRONG)
    reader = RedfishReader(RedfishTarget(bmc.url, creds, ca_file=certs["bmc"].cert))
    with pytest.raises(PowerReadError) as raised:
        reader.power_w()
    assert raised.value.refused
    assert "refused the credentials" in str(raised.value) and creds in str(raised.value)
    assert WRONG not in str(raised.value) and PASSWORD not in str(raised.value)

    background = BackgroundPowerReader("redfish", reader.power_w, interval_s=30)
    with caplog.at_level(logging.INFO, logger="jobsight.agent.power"):
        for _ in range(3):
            background.read_once()
        warnings = [r for r in caplog.records if r.name == "jobsight.agent.power" and r.levelno == logging.WARNING]
        assert len(warnings) == 1 and creds in warnings[0].getMessage()
        assert background.failures == 3 and background.latest(60) is None

        credentials(tmp_path)  # the password is rotated into the file
        background.read_once()
    infos = [r for r in caplog.records if r.name == "jobsight.agent.power" and r.levelno == logging.INFO]
    assert len(infos) == 1 and "is back" in infos[0].getMessage()
    reading = background.latest(60)
    assert reading is not None and reading.watts == 640.0
    assert WRONG not in caplog.text and PASSWORD not in caplog.text


def test_untrusted_certificate_is_a_read_error(serve: Any, certs: dict[str, Cert], tmp_path: Path) -> None:
    bmc = serve({"/redfish/v1/Chassis": CHASSIS,
                 "/redfish/v1/Chassis/1/Power": {"PowerControl": [{"PowerConsumedWatts": 640}]}})
    for ca_file in (None, certs["other"].cert):  # the system's CAs, and a CA that did not sign it
        reader = RedfishReader(RedfishTarget(bmc.url, credentials(tmp_path), ca_file=ca_file))
        with pytest.raises(PowerReadError, match="TLS certificate") as raised:
            reader.power_w()
        assert not raised.value.refused and PASSWORD not in str(raised.value)
        assert raised.value.__cause__ is None


def test_silent_server_times_out(serve: Any, certs: dict[str, Cert], tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:  # accepts TCP, never says a word of TLS
        url = f"https://127.0.0.1:{listener.getsockname()[1]}"
        reader = RedfishReader(RedfishTarget(url, credentials(tmp_path), ca_file=certs["bmc"].cert, timeout_s=1))
        started = time.monotonic()
        with pytest.raises(PowerReadError, match="no answer"):
            reader.power_w()
        assert time.monotonic() - started < 3

    bmc = serve({"/redfish/v1/Chassis": CHASSIS, "/redfish/v1/Chassis/1/Power": HANG})  # TLS, then silence
    reader = RedfishReader(RedfishTarget(bmc.url, credentials(tmp_path), ca_file=certs["bmc"].cert, timeout_s=1))
    started = time.monotonic()
    with pytest.raises(PowerReadError, match="no answer from .*/Power in 1 s"):
        reader.power_w()
    assert time.monotonic() - started < 3


def test_broken_answers_and_files(serve: Any, certs: dict[str, Cert], tmp_path: Path) -> None:
    ca = certs["bmc"].cert
    bmc = serve({"/redfish/v1/Chassis": CHASSIS, "/redfish/v1/Chassis/1/Power": {"PowerControl": []}})

    def read(**routes: Any) -> PowerReadError:
        bmc.routes.update(routes)
        with pytest.raises(PowerReadError) as raised:
            RedfishReader(RedfishTarget(bmc.url, credentials(tmp_path), ca_file=ca)).power_w()
        assert PASSWORD not in str(raised.value)
        return raised.value

    assert "has no PowerControl" in str(read())
    power = "/redfish/v1/Chassis/1/Power"
    assert "not a number" in str(read(**{power: {"PowerControl": [{"PowerConsumedWatts": "lots"}]}}))
    assert "is missing" in str(read(**{power: {"PowerControl": [{"PowerConsumedWatts": None}]}}))
    assert "not JSON" in str(read(**{power: b"<html>oops</html>"}))
    assert "more than 1 MiB" in str(read(**{power: b" " * (2 << 20)}))
    assert "lists no chassis" in str(read(**{"/redfish/v1/Chassis": {"Members": []}}))

    missing = str(tmp_path / "nowhere")
    with pytest.raises(PowerReadError, match=f"credentials file {missing}"):
        RedfishReader(RedfishTarget(bmc.url, missing, ca_file=ca)).power_w()
    with pytest.raises(PowerReadError, match=f"CA file {tmp_path}"):
        RedfishReader(RedfishTarget(bmc.url, credentials(tmp_path), ca_file=str(tmp_path / "no-ca.pem"))).power_w()

    with socket.create_server(("127.0.0.1", 0)) as listener:
        closed = f"https://127.0.0.1:{listener.getsockname()[1]}"
    with pytest.raises(PowerReadError, match="connection to .* refused"):
        RedfishReader(RedfishTarget(closed, credentials(tmp_path), ca_file=ca)).power_w()

    for url in (f"https://{USER}:{PASSWORD}@127.0.0.1", "http://127.0.0.1", "https://127.0.0.1/redfish"):
        with pytest.raises(ValueError) as bad:
            RedfishTarget(url, None)
        assert PASSWORD not in str(bad.value)
