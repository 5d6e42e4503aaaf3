"""Zero-code profiling end to end, with real processes: a live collector, the node daemon's Kineto
service (agent/node/kineto/service.py) on a socket of the test's own (``KINETO_IPC_SOCKET_DIR``),
and PyTorch scripts that import nothing of jobsight, run with ``KINETO_USE_DAEMON=1``.

* A profile request made through the API reaches a plain training loop: its trace is stored under
  the job with the process's pid and rank, top ops, and a trace that Holistic Trace Analysis parses.
* A two-process DDP run on gloo gets one trace per rank.
* A process of another job that asks with the first job's pids gets nothing.
* A trace path replaced by a symlink is refused and nothing is read through it.
* With the socket already bound (a second agent on the socket directory, a Dynolog on the
  abstract name when a site opted into it), the service steps aside and says so.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install 'jobsight[frameworks]')")

from jobsight.agent.node.kineto.endpoint import KinetoEndpoint  # noqa: E402
from jobsight.agent.node.kineto.service import KinetoService  # noqa: E402
from jobsight.agent.node.kineto.traces import TraceRefused, Window, read_trace  # noqa: E402
from jobsight.agent.node.kineto.wire import encode_request  # noqa: E402
from jobsight.agent.node.registrations import Registration, write_registration  # noqa: E402
from jobsight.agent.settings import AgentSettings  # noqa: E402
from jobsight.agent.shipping.shipper import Shipper  # noqa: E402
from jobsight.protocol.wire import now_us  # noqa: E402
from tests.frameworks.support import api  # noqa: E402

NODE = "kineto-node"
PROFILE_WAIT_S = 30.0

LOOP = textwrap.dedent("""
    import os, sys, time
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(32, 64)
    deadline = time.monotonic() + float(sys.argv[1])
    print("ready", flush=True)
    stepping = sys.argv[2:] != ["no-optimizer"]
    while time.monotonic() < deadline:
        optimizer.zero_grad()
        model(batch).sum().backward()
        if stepping:
            optimizer.step()
        time.sleep(0.02)
""")

DDP_LOOP = textwrap.dedent("""
    import os, sys, time
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(16, 32)
    deadline = time.monotonic() + float(sys.argv[1])
    while True:
        optimizer.zero_grad()
        model(batch).sum().backward()
        optimizer.step()
        time.sleep(0.02)
        done = torch.tensor([1 if time.monotonic() > deadline else 0])
        dist.all_reduce(done)
        if done.item():
            break
    dist.destroy_process_group()
""")


class Node:
    """The node side: registrations, the Kineto service and its shipper, the socket directory."""

    def __init__(self, collector: Any, tmp: Path) -> None:
        self.collector = collector
        self.tmp = tmp
        # Short: Kineto builds its own socket path from this directory without checking its length.
        self.socket_dir = Path(tempfile.mkdtemp(prefix="jsk", dir="/tmp"))
        self.socket_dir.chmod(0o755)
        self.registration_dir = tmp / "jobs"
        self.trace_dir = tmp / "traces"
        self.settings = AgentSettings(url=collector.url, token=collector.token, node=NODE, spool_dir=str(tmp / "spool"),
                                      registration_dir=str(self.registration_dir), batch_age_s=0.2,
                                      kineto_socket_dir=str(self.socket_dir), kineto_trace_dir=str(self.trace_dir))
        self.shipper = Shipper(self.settings)
        self.service = KinetoService(self.settings, self.shipper, window_timeout_s=60.0)

    def register(self, job: str) -> None:
        """The job as the prolog registers it: with the collector and in the registration directory."""
        record = {"kind": "job_started", "job": job, "ts": now_us(), "node": NODE, "user": "root", "uid": os.getuid(),
                  "nodes": [NODE], "gpus": []}
        self.shipper.enqueue(record)
        assert self.shipper.flush(20.0)
        write_registration(self.registration_dir, Registration(cluster="default", job_id=job, node=NODE,
                                                               started_us=now_us(), uid=os.getuid()))
        self.wait_for_socket()

    @property
    def user_socket_dir(self) -> Path:
        """The socket directory of this test's user (root), as the task prolog exports it."""
        return self.socket_dir / str(os.getuid())

    def env(self, job: str, **extra: str) -> dict[str, str]:
        """A job's process environment, as the task prolog leaves it (no jobsight import anywhere)."""
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("JOBSIGHT_", "KINETO_"))}
        return {**keep, "JOBSIGHT_JOB_ID": job, "SLURM_JOB_ID": job, "KINETO_USE_DAEMON": "1",
                "KINETO_IPC_SOCKET_DIR": str(self.user_socket_dir), **extra}

    def wait_for_socket(self) -> None:
        """The user's socket, made once a registration of that user is seen (within a round)."""
        _wait("the user's socket", lambda: (self.user_socket_dir / "dynolog").is_socket(), timeout=10)

    def stop(self) -> None:
        self.service.stop()
        self.shipper.flush(20.0)
        self.shipper.shutdown(5.0)
        shutil.rmtree(self.socket_dir, ignore_errors=True)


@pytest.fixture
def node(live_collector: Any, tmp_path: Path) -> Iterator[Node]:
    tmp_path.chmod(0o755)
    made = Node(live_collector, tmp_path)
    assert made.service.start(), made.service.status.message
    yield made
    made.stop()


def _job() -> str:
    return f"kz-{uuid.uuid4().hex[:10]}"


def _request(collector: Any, job: str, **body: Any) -> int:
    answer = api(collector, f"/v1/jobs/{job}/profile-requests", method="POST", body={"steps": 3, **body})
    return int(answer["id"])


def _wait(what: str, check: Callable[[], Any], timeout: float = PROFILE_WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


def test_a_plain_loop_is_profiled_on_request_and_hta_reads_its_trace(node: Node, tmp_path: Path) -> None:
    job = _job()
    node.register(job)
    request = _request(node.collector, job)
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    process = subprocess.Popen([sys.executable, str(script), "40"], env=node.env(job), cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        started = time.monotonic()
        profiles = _wait("a profile of the plain loop",
                         lambda: api(node.collector, f"/v1/jobs/{job}/profiles")["profiles"])
        took = time.monotonic() - started
    finally:
        process.kill()
        output = process.communicate(timeout=30)[0]
    assert took < PROFILE_WAIT_S, output
    profile = profiles[0]
    assert (profile["pid"], profile["rank"], profile["request_id"]) == (process.pid, 0, request)
    names = [op["name"] for op in profile["summary"]["ops_by_self_cpu"]]
    assert any(name.startswith("aten::") for name in names), names
    assert profile["summary"]["source"] == "kineto" and profile["trace_url"]
    requests = api(node.collector, f"/v1/jobs/{job}/profile-requests")["requests"]
    assert [(r["id"], r["state"]) for r in requests] == [(request, "done")]

    hta_analysis = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis (import hta) is not "
                                                                    "installed: pip install 'jobsight[dev]'")
    folder = tmp_path / "hta"
    folder.mkdir()
    raw, _ = api(node.collector, profile["trace_url"])  # the trace, as the API serves it (gunzipped here)
    (folder / "rank0.pt.trace.json.gz").write_bytes(gzip.compress(raw))
    analysis = hta_analysis.TraceAnalysis(trace_dir=str(folder), include_last_profiler_step=True)
    assert sorted(analysis.t.traces) == [0]
    trace = analysis.t.get_trace(0)
    symbols = analysis.t.symbol_table.get_sym_table()
    assert any(symbols[i].startswith("aten::") for i in set(trace["name"]))
    # Nothing of the window is left on the node.
    assert not list((node.trace_dir / job).iterdir())


def test_a_loop_without_an_optimizer_gets_a_timed_window(node: Node, tmp_path: Path) -> None:
    job = _job()
    node.register(job)
    _request(node.collector, job, steps=2)  # two seconds, for a loop that counts no iterations
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    process = subprocess.Popen([sys.executable, str(script), "40", "no-optimizer"], env=node.env(job), cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        profiles = _wait("a timed profile", lambda: api(node.collector, f"/v1/jobs/{job}/profiles")["profiles"])
    finally:
        process.kill()
        process.wait(30)
    names = [op["name"] for op in profiles[0]["summary"]["ops_by_self_cpu"]]
    assert profiles[0]["pid"] == process.pid and any(name.startswith("aten::") for name in names), names


def test_a_two_rank_ddp_run_gets_one_trace_per_rank(node: Node, tmp_path: Path) -> None:
    job = _job()
    node.register(job)
    _request(node.collector, job)
    script = tmp_path / "ddp.py"
    script.write_text(DDP_LOOP)
    log = tmp_path / "ddp.log"
    with open(log, "wb") as out:
        run = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                                "--master_port", str(_free_port()), str(script), "40"],
                               env=node.env(job), cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        profiles = _wait("a trace from each rank", lambda: (
            found := api(node.collector, f"/v1/jobs/{job}/profiles")["profiles"]) and len(found) == 2 and found,
            timeout=45.0)
    finally:
        run.terminate()  # torchrun stops its ranks
        try:
            run.wait(30)
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait(10)
        output = log.read_text(errors="replace")
    assert sorted(p["rank"] for p in profiles) == [0, 1], output[-2000:]
    assert len({p["pid"] for p in profiles}) == 2


def test_another_jobs_process_asking_with_its_pids_gets_nothing(node: Node, tmp_path: Path) -> None:
    victim, other = _job(), _job()
    node.register(victim)
    node.register(other)
    _request(node.collector, victim)
    node.service._asking[victim] = time.monotonic()  # as if the victim's own processes polled
    node.service._polled_at = -1e9
    node.service._refresh()  # the victim's request is known to the service
    assert [p.id for p in node.service._pending[victim]], node.service._pending
    sender = tmp_path / "pose.py"
    sender.write_text(textwrap.dedent(f"""
        import socket, sys, uuid
        request = bytes.fromhex(sys.argv[1])
        me = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        me.bind({str(node.user_socket_dir)!r} + "/client" + uuid.uuid4().hex[:8])
        me.settimeout(5)
        me.sendto(request, {str(node.user_socket_dir / "dynolog")!r})
        print(me.recv(65536).hex())
    """))
    sleeper = subprocess.Popen(["sleep", "60"], env=node.env(victim))  # a process of the victim's job
    try:
        for pids in ((sleeper.pid,), (sleeper.pid, os.getpid())):
            answer = subprocess.run([sys.executable, str(sender), encode_request(0, pids).hex()],
                                    env=node.env(other), capture_output=True, text=True, timeout=30)
            assert answer.returncode == 0, answer.stderr
            reply = parse_reply(bytes.fromhex(answer.stdout.strip()))
            assert reply == "", reply  # no config for a process posing as the victim's
    finally:
        sleeper.kill()
    assert node.service.status.refused.get("pids not the sender's", 0) >= 2
    assert node.service.status.configs_given == 0
    requests = api(node.collector, f"/v1/jobs/{victim}/profile-requests")["requests"]
    assert [r["state"] for r in requests] == ["pending"]


def parse_reply(data: bytes) -> str:
    """The config text of a "req" answer (the header's body)."""
    header = 40
    assert len(data) >= header
    return data[header:].decode()


def test_a_trace_replaced_by_a_symlink_is_refused_and_not_read(node: Node, tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"traceEvents": [{"name": "SECRET", "ph": "X", "ts": 1, "dur": 1}]}))
    link = tmp_path / "link.json"
    link.symlink_to(secret)
    with pytest.raises(TraceRefused, match="links"):
        read_trace(link, os.getuid(), 1 << 20)
    with pytest.raises(TraceRefused, match="owned by uid"):
        read_trace(secret, os.getuid() + 12345, 1 << 20)
    # Through the service: a window whose trace path is a link fails its request, and nothing is shipped.
    job = _job()
    node.register(job)
    request = _request(node.collector, job)
    directory = node.trace_dir / job
    directory.mkdir(parents=True)
    window = Window(request, job, 0, os.getpid(), os.getuid(), directory, 3, time.monotonic())
    KinetoService._trace_path(window).symlink_to("/etc/shadow")
    node.service._windows[os.getpid()] = window
    node.service._collect_one(os.getpid(), window)  # notes the size
    node.service._collect_one(os.getpid(), window)  # tries it
    node.service._send_reports()
    requests = _wait("the request failed", lambda: [
        r for r in api(node.collector, f"/v1/jobs/{job}/profile-requests")["requests"] if r["state"] == "failed"])
    assert "trace refused" in requests[0]["reason"] and "links" in requests[0]["reason"], requests
    assert node.service.status.profiles_shipped == 0
    assert not KinetoService._trace_path(window).exists()


def test_with_the_socket_already_bound_the_service_steps_aside(live_collector: Any, tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    node = Node(live_collector, tmp_path)
    second = KinetoService(node.settings, node.shipper)  # another agent, on the same socket directory
    try:
        assert node.service.start()
        assert second.start() is False
        assert "stepped aside" in second.status.message and "another jobsight agent" in second.status.message
        assert "callbacks still profile" in second.status.message
    finally:
        node.stop()
    # A site that opted into the abstract name, where its Dynolog already answers.
    name = f"jobsight-test-{uuid.uuid4().hex[:12]}"
    abstract = dataclasses.replace(node.settings, kineto_abstract_socket=True)
    with KinetoEndpoint(name):  # a site's Dynolog, say
        service = KinetoService(abstract, node.shipper, socket_name=name)
        assert service.start() is False
        assert "stepped aside" in service.status.message and f"@{name}" in service.status.message


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
