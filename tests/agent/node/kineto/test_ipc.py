"""The Kineto endpoint against real PyTorch processes and hand-made datagrams.

A plain training loop (it imports nothing of jobsight) runs with ``KINETO_USE_DAEMON=1``; the
endpoint answers its poll with a trace config and the test waits for the Chrome trace Kineto
writes. Kineto's socket name is fixed ("dynolog"); only its directory can move
(``KINETO_IPC_SOCKET_DIR``), so the real process is tested once on a socket file in a private
directory and once on the real abstract name, skipped when that is taken (a Dynolog on the host).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobsight.agent.node.kineto import wire
from jobsight.agent.node.kineto.endpoint import Credentials, EndpointBusy, KinetoEndpoint, Served
from jobsight.agent.node.kineto.wire import KinetoRequest, MalformedDatagram

pytest.importorskip("torch")

TRAINING = r"""
import sys, time
from pathlib import Path
import torch

started = Path(sys.argv[1])
model = torch.nn.Linear(32, 32)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(16, 32)
for step in range(300):
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step == 0:
        started.touch()
    time.sleep(0.05)
"""

JOB_ID = 4242
TRACE_WAIT_S = 25.0


def unique_name() -> str:
    return f"jobsight-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def socket_dir() -> Iterator[str]:
    # Kineto copies <dir>/dynoconfigclient<uuid> into sun_path (108 bytes) without a length check:
    # pytest's tmp_path can be too long for that, so the sockets get a short directory of their own.
    path = tempfile.mkdtemp(prefix="jsk", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def client() -> Iterator[socket.socket]:
    """A bound datagram socket playing Kineto's part: replies come back to its own name."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + unique_name().encode() + b"\0")
    sock.settimeout(2.0)
    yield sock
    sock.close()


# -- the wire format ------------------------------------------------------------------------------


def test_request_layout_matches_kineto() -> None:
    data = wire.encode_request(JOB_ID, (300, 200, 100), config_type=3)
    assert len(data) == 40 + 16 + 3 * 4
    assert data[8:12] == b"req\0"
    request = wire.parse_datagram(data)
    assert request == KinetoRequest("req", JOB_ID, (300, 200, 100), config_type=3)
    assert request.wants_activities
    assert not wire.parse_datagram(wire.encode_request(0, (1,), config_type=1)).wants_activities


def test_context_and_replies() -> None:
    assert wire.parse_datagram(wire.encode_context(7, 1234, gpu=2)) == KinetoRequest("ctxt", 7, (1234,), gpu=2)
    reply = wire.encode_config_reply("ACTIVITIES_ITERATIONS=3\n")
    assert int.from_bytes(reply[:8], sys.byteorder) == len(reply) - 40 == 24
    assert reply[8:40] == b"req".ljust(32, b"\0") and reply[40:] == b"ACTIVITIES_ITERATIONS=3\n"
    assert wire.encode_config_reply("") == (0).to_bytes(8, sys.byteorder) + b"req".ljust(32, b"\0")
    assert wire.encode_context_reply(1)[8:] == b"ctxt".ljust(32, b"\0") + (1).to_bytes(4, sys.byteorder)
    with pytest.raises(ValueError):
        wire.encode_config_reply("X" * (wire.MAX_CONFIG_BYTES + 1))


def hostile_datagrams() -> list[bytes]:
    good = wire.encode_request(1, (10, 9))
    body = good[40:]
    return [
        b"",
        good[:39],
        good[:-1],  # body shorter than the header says
        good + b"\0",  # body longer than the header says
        wire.HEADER.pack(len(body), b"nope") + body,
        wire.HEADER.pack(len(body), b"r" * 32) + body,  # type without its NUL
        wire.HEADER.pack(2**63, b"req") + body,
        wire.HEADER.pack(16, b"req") + wire.REQUEST_FIXED.pack(2, 0, 1),  # no pids
        wire.HEADER.pack(16, b"req") + wire.REQUEST_FIXED.pack(2, 2**31 - 1, 1),  # n far beyond the data
        wire.HEADER.pack(16, b"req") + wire.REQUEST_FIXED.pack(2, -5, 1),
        wire.encode_request(1, tuple(range(1, wire.MAX_PIDS + 2))),
        wire.encode_request(1, (0, 5)),
        wire.HEADER.pack(8, b"ctxt") + b"\1" * 8,
    ]


@pytest.mark.parametrize("data", hostile_datagrams())
def test_parser_rejects_malformed(data: bytes) -> None:
    with pytest.raises(MalformedDatagram):
        wire.parse_datagram(data)


# -- the endpoint ---------------------------------------------------------------------------------


def read_reply(sock: socket.socket) -> tuple[str, bytes]:
    data = sock.recv(65536)
    size = int.from_bytes(data[:8], sys.byteorder)
    assert size == len(data) - 40
    return data[8:40].split(b"\0", 1)[0].decode(), data[40:]


def test_endpoint_survives_malformed_datagrams(client: socket.socket) -> None:
    name = unique_name()
    decided: list[tuple[KinetoRequest, Credentials]] = []

    def decide(request: KinetoRequest, creds: Credentials) -> str | None:
        decided.append((request, creds))
        return "ACTIVITIES_ITERATIONS=2\n" if request.pids[0] == 77 else None

    with KinetoEndpoint(name) as endpoint:
        address = b"\0" + name.encode() + b"\0"
        oversized = wire.encode_request(1, (5,)) + b"\0" * (wire.MAX_DATAGRAM_BYTES + 100)
        for data in [*hostile_datagrams(), oversized]:
            client.sendto(data, address)
            served = endpoint.serve_once(2.0, decide)
            assert served is not None and served.error, data
            assert served.request is None and served.creds is not None
            assert served.creds.pid == os.getpid() and served.creds.uid == os.getuid()
        assert decided == []

        client.sendto(wire.encode_request(JOB_ID, (77, 1)), address)
        served = endpoint.serve_once(2.0, decide)
        assert served == Served(Credentials(os.getpid(), os.getuid(), os.getgid()),
                                KinetoRequest("req", JOB_ID, (77, 1), config_type=2),
                                config="ACTIVITIES_ITERATIONS=2\n")
        assert read_reply(client) == ("req", b"ACTIVITIES_ITERATIONS=2\n")

        client.sendto(wire.encode_request(JOB_ID, (78,)), address)
        assert endpoint.serve_once(2.0, decide) is not None
        assert read_reply(client) == ("req", b"")  # "no config"

        client.sendto(wire.encode_context(JOB_ID, 78, gpu=0), address)
        served = endpoint.serve_once(2.0, decide)
        assert served is not None and served.request is not None and served.request.kind == "ctxt"
        assert read_reply(client) == ("ctxt", (1).to_bytes(4, sys.byteorder))
        assert len(decided) == 2

        assert endpoint.serve_once(0.05, decide) is None


def test_failing_decide_still_answers(client: socket.socket) -> None:
    name = unique_name()

    def decide(request: KinetoRequest, creds: Credentials) -> str | None:
        raise RuntimeError("bug in decide")

    with KinetoEndpoint(name) as endpoint:
        client.sendto(wire.encode_request(1, (5,)), b"\0" + name.encode() + b"\0")
        served = endpoint.serve_once(2.0, decide)  # reported, never raised: the next datagram is served
        assert served is not None and served.error and "bug in decide" in served.error
        assert read_reply(client) == ("req", b"")


def test_binding_twice_is_busy(socket_dir: str) -> None:
    name = unique_name()
    with KinetoEndpoint(name):
        with pytest.raises(EndpointBusy, match=f"@{name}"):
            KinetoEndpoint(name)
    KinetoEndpoint(name).close()  # released on close

    with KinetoEndpoint("dynolog", socket_dir=socket_dir) as endpoint:
        assert endpoint.path == os.path.join(socket_dir, "dynolog")
        assert os.stat(endpoint.path).st_mode & 0o777 == 0o666
        with pytest.raises(EndpointBusy):
            KinetoEndpoint("dynolog", socket_dir=socket_dir)
    assert not os.path.exists(os.path.join(socket_dir, "dynolog"))


def test_stale_socket_file_is_taken_over(socket_dir: str) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stale.bind(os.path.join(socket_dir, "dynolog"))
    stale.close()  # the file stays, nobody reads it: what a killed daemon leaves behind
    with KinetoEndpoint("dynolog", socket_dir=socket_dir) as endpoint:
        assert endpoint.fileno() >= 0


def test_bad_names_are_refused() -> None:
    for name in ["", "a/b", "a\0b", "x" * 107]:
        with pytest.raises(ValueError):
            KinetoEndpoint(name)


# -- a real PyTorch process -----------------------------------------------------------------------


def training_env(tmp_path: Path, socket_dir: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KINETO_", "SLURM_"))}
    config = tmp_path / "libkineto.conf"
    # The base config sets how often the process polls (default 5 s): 1 s keeps the test short.
    config.write_text("ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=1\n")
    env.update(KINETO_USE_DAEMON="1", KINETO_CONFIG=str(config), SLURM_JOB_ID=str(JOB_ID),
               # Newer Kineto keeps daemon-chosen trace files under /tmp unless told otherwise.
               KINETO_ONDEMAND_TRACE_DIR=str(tmp_path))
    if socket_dir is not None:
        env["KINETO_IPC_SOCKET_DIR"] = socket_dir
    return env


def profile_one_process(endpoint: KinetoEndpoint, tmp_path: Path, socket_dir: str | None) -> dict[str, Any]:
    started = tmp_path / "started"
    script = tmp_path / "train.py"
    script.write_text(TRAINING)
    config = f"ACTIVITIES_LOG_FILE={tmp_path / 'trace.json'}\nPROFILE_START_ITERATION=0\nACTIVITIES_ITERATIONS=3\n"
    proc = subprocess.Popen([sys.executable, str(script), str(started)], cwd=tmp_path,
                            env=training_env(tmp_path, socket_dir),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen: list[tuple[KinetoRequest, Credentials]] = []
    given: list[KinetoRequest] = []

    def decide(request: KinetoRequest, creds: Credentials) -> str | None:
        if creds.pid != proc.pid:
            return None  # another Kineto process on this host
        seen.append((request, creds))
        # The first poll comes while torch is imported: a config then, before any optimizer step,
        # would be run as a 500 ms time window instead of counted iterations.
        if given or not started.exists() or not request.wants_activities:
            return None
        given.append(request)
        return config

    trace = tmp_path / f"trace_{proc.pid}.json"
    deadline = time.monotonic() + TRACE_WAIT_S
    try:
        while time.monotonic() < deadline and not trace.exists():
            endpoint.serve_once(0.2, decide)
            if proc.poll() is not None:
                break
    finally:
        proc.kill()
        output = proc.communicate()[0].decode(errors="replace")
    assert trace.exists(), f"no trace; requests {seen}; process output:\n{output[-3000:]}"

    assert seen, "the process never polled"
    request, creds = seen[0]
    assert creds == Credentials(proc.pid, os.getuid(), os.getgid())
    assert request.kind == "req" and request.job_id == JOB_ID
    assert request.pids[:2] == (proc.pid, os.getpid())  # itself first, then its parent
    assert len(given) == 1
    assert not (tmp_path / "trace.json").exists()  # Kineto puts the pid into the name
    result: dict[str, Any] = json.loads(trace.read_text())
    return result


def assert_three_iterations(trace: dict[str, Any]) -> None:
    events = trace["traceEvents"]
    assert any(e.get("cat") == "cpu_op" and str(e.get("name", "")).startswith("aten::") for e in events)
    steps = [e for e in events if str(e.get("name", "")).startswith("Optimizer.step#")]
    assert len(steps) == 3, [e["name"] for e in steps]


def test_kineto_traces_on_request_via_socket_dir(tmp_path: Path, socket_dir: str) -> None:
    with KinetoEndpoint("dynolog", socket_dir=socket_dir) as endpoint:
        assert_three_iterations(profile_one_process(endpoint, tmp_path, socket_dir))


def test_kineto_traces_on_request_via_abstract_dynolog(tmp_path: Path) -> None:
    try:
        endpoint = KinetoEndpoint()
    except EndpointBusy as exc:
        pytest.skip(f"the real Kineto socket is taken on this host: {exc}")
    with endpoint:
        assert endpoint.address == "@dynolog"
        assert_three_iterations(profile_one_process(endpoint, tmp_path, None))
