"""Hostile tests of the node side of zero-code profiling: the six findings of the security review,
each played by a real process (run as another uid where it matters: the process starts as root and
drops to the uid before it does anything) against the real Kineto service and its real sockets.

1. A process whose ``RANK`` is not ASCII digits (``²``) gets "no config", and a neighbour job's
   process is still answered within Kineto's 0.1 s.
2. A trace that is not a trace (``{"traceEvents":[1]}``, JSON nested past the parser's depth) fails
   its own window with the reason and is removed; the windows behind it are collected; a round
   reads a bounded number of traces.
3. A user flooding the daemon does not starve another user's processes: per-user sockets (the
   default) keep the flood in its own queue, and a per-uid rate limit cuts what is read past it.
4. A window's trace is found by its exact name: pid 12 never takes pid 123's file.
5. No other user can bind where jobs look for the daemon, before it starts or across a restart;
   the status tells the task prolog whether it serves; the epilog removes a job's traces
   without following a link; Kineto writes its traces where no other user reads them.
6. The job comes from the process's Slurm cgroup (v1 and v2, an array task through its
   registration's ``slurm_job_id``, a SLUID folder through its registration's ``sluid``), its
   environment only outside Slurm.

Kineto's client is played by :data:`CLIENT` (its socket, timing and message layout), so that the
uid, the environment and the flood are the test's to choose.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jobsight.agent.node.kineto.endpoint import Credentials, KinetoEndpoint
from jobsight.agent.node.kineto.process import rank_of
from jobsight.agent.node.kineto.service import KinetoService
from jobsight.agent.node.kineto.traces import Window
from jobsight.agent.node.kineto.wire import encode_request, parse_datagram
from jobsight.agent.node.registrations import Registration, write_registration
from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.directives import ProfileRequest as PendingRequest
from jobsight.agent.shipping.shipper import Shipper
from jobsight.protocol.wire import now_us

FLOOD_UID = 64101
VICTIM_UID = 64102
OTHER_UID = 64103
REPO = Path(__file__).resolve().parents[4]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plays other users' processes: needs root")

CLIENT = r"""
import ctypes, json, os, socket, struct, sys, time, uuid

args = json.loads(sys.argv[1])
if args.get("uid") is not None:
    os.setgroups([])
    os.setgid(args["uid"])
    os.setuid(args["uid"])
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: /proc/<pid> is the user's again, as after exec
if args.get("wait_for"):
    deadline = time.monotonic() + 20
    while not os.path.exists(args["wait_for"]) and time.monotonic() < deadline:
        time.sleep(0.02)
HEADER = struct.Struct("=Q32s")


def address(name):
    if args.get("dir"):
        return os.path.join(args["dir"], name)
    return b"\0" + (args["abstract"] if name == "dynolog" else name).encode() + b"\0"


def request(kind=2):
    pids = [os.getpid(), os.getppid()]
    body = struct.pack("=iiq", kind, len(pids), 0) + b"".join(struct.pack("=i", p) for p in pids)
    return HEADER.pack(len(body), b"req") + body


def kineto_socket():
    me = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    me.bind(address("dynoconfigclient" + str(uuid.uuid4())))
    return me


def send(me, data):
    # Kineto's sync_send: MSG_DONTWAIT, retried 10 times from 10 ms, doubling.
    pause = 0.01
    for _ in range(10):
        try:
            me.sendto(data, socket.MSG_DONTWAIT, address("dynolog"))
            return True
        except (BlockingIOError, ConnectionRefusedError):
            time.sleep(pause)
            pause *= 2
        except OSError:
            return False
    return False


def receive(me, wait):
    deadline = time.monotonic() + wait
    while True:
        try:
            return me.recv(65536, socket.MSG_DONTWAIT)[40:].decode()
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.005)


def poll():
    me = kineto_socket()
    replies = []
    for _ in range(args["n"]):
        while receive(me, 0) is not None:
            pass  # a late answer to an earlier poll is not this poll's
        replies.append(receive(me, args.get("wait", 0.1)) if send(me, request()) else None)
        time.sleep(args["every"])
    return replies


def flood():
    me = kineto_socket()
    me.setblocking(args["blocking"])
    data, sent = request(), 0
    deadline = time.monotonic() + args["seconds"]
    while time.monotonic() < deadline:
        try:
            me.sendto(data, address("dynolog"))
            sent += 1
        except (BlockingIOError, ConnectionRefusedError):
            pass
    return {"sent": sent}


def try_each(what):
    found = {}
    for path in args["paths"]:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            probe.bind(path) if what == "bind" else probe.sendto(request(), path)
            found[path] = "ok"
        except OSError as exc:
            found[path] = exc.errno
        finally:
            probe.close()
    return found


result = {"poll": poll, "flood": flood, "bind": lambda: try_each("bind"), "send": lambda: try_each("send")}
print(json.dumps(result[args["mode"]]()), flush=True)
"""


def client_command(args: dict[str, Any]) -> list[str]:
    return [sys.executable, "-I", "-c", CLIENT, json.dumps(args)]


def client_env(**extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("JOBSIGHT_", "KINETO_", "SLURM_", "RANK"))}
    return {**keep, **extra}


def run_client(args: dict[str, Any], env: dict[str, str] | None = None, timeout: float = 90) -> Any:
    done = subprocess.run(client_command(args), env=env or client_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def start_client(args: dict[str, Any], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(client_command(args), env=env or client_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def result_of(process: subprocess.Popen[str], timeout: float = 90) -> Any:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return json.loads(out)


def answered(replies: list[str | None]) -> int:
    return sum(reply is not None for reply in replies)


def closed_url() -> str:
    """A collector address nobody listens on: these tests need no collector."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def wait_until(what: str, check: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


def short_dir() -> Path:
    """A directory other users can reach (pytest's own are root's 0700), with a short path:
    Kineto builds its socket paths from it without a length check."""
    path = Path(tempfile.mkdtemp(prefix="jsk", dir="/tmp"))
    path.chmod(0o755)
    return path


class Daemon:
    """The node daemon's Kineto side: registrations, trace root, socket directory, no collector."""

    def __init__(self, root: Path, *, abstract: str | None = None, url: str | None = None,
                 token: str | None = "unused", **settings: Any) -> None:
        self.root = root
        self.socket_dir = short_dir()
        self.registration_dir = root / "jobs"
        self.abstract = abstract
        fields: dict[str, Any] = {
            "url": url or closed_url(), "token": token, "node": "hostile-node", "spool_dir": str(root / "spool"),
            "registration_dir": str(self.registration_dir), "batch_age_s": 0.2,
            "kineto_trace_dir": str(root / "traces"), "kineto_socket_dir": None if abstract else str(self.socket_dir),
            **settings}
        self.settings = AgentSettings(**fields)
        self.trace_dir = Path(self.settings.kineto_trace_dir)
        self.shipper = Shipper(self.settings)
        self.service = self.new_service()

    def new_service(self, **kwargs: Any) -> KinetoService:
        return KinetoService(self.settings, self.shipper, socket_name=self.abstract or "dynolog", **kwargs)

    def register(self, job: str, uid: int, **fields: Any) -> None:
        write_registration(self.registration_dir, Registration(cluster="default", job_id=job, node="hostile-node",
                                                               started_us=now_us(), uid=uid, **fields))

    def user_dir(self, uid: int) -> str:
        return str(self.socket_dir / str(uid))

    def address_args(self, uid: int) -> dict[str, Any]:
        """Where a process of ``uid`` finds the daemon (KINETO_IPC_SOCKET_DIR, or the abstract name)."""
        return {"abstract": self.abstract} if self.abstract else {"dir": self.user_dir(uid)}

    def wait_for_socket(self, uid: int) -> None:
        """Until the user's socket is bound and given to the user (bound first, then chown-ed)."""
        def ready() -> bool:
            try:
                info = os.stat(Path(self.user_dir(uid), "dynolog"))
            except OSError:
                return False
            return stat.S_ISSOCK(info.st_mode) and info.st_uid == uid

        wait_until(f"the socket of uid {uid}", ready)

    def stop(self) -> None:
        self.service.stop()
        self.shipper.shutdown(1.0)
        shutil.rmtree(self.socket_dir, ignore_errors=True)


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    made: list[Daemon] = []

    def make(**kwargs: Any) -> Daemon:
        root = short_dir()  # other uids must reach the trace root of some tests
        made.append(Daemon(root, **kwargs))
        return made[-1]

    yield make
    for daemon in made:
        daemon.stop()
        shutil.rmtree(daemon.root, ignore_errors=True)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# -- 1. a rank that is not ASCII digits -----------------------------------------------------------


def test_a_rank_that_is_not_ascii_digits_is_rank_0() -> None:
    for value in ["²", "٣", "１", "9" * 5000, "-1", " 1", "1e3"]:
        assert rank_of({"RANK": value}) == 0, value
    assert rank_of({"RANK": "²", "SLURM_PROCID": "3"}) == 3
    assert rank_of({"LOCAL_RANK": "12"}) == 12


def test_a_process_with_rank_in_foreign_digits_stalls_no_one(daemons: Callable[..., Daemon]) -> None:
    daemon = daemons(abstract=unique("jobsight-test"))
    hostile, neighbour = unique("rank"), unique("neighbour")
    daemon.register(hostile, os.getuid())
    daemon.register(neighbour, os.getuid())
    assert daemon.service.start(), daemon.service.status.message
    # Every poll of the hostile process after its first reaches the rank (its first is only noted).
    bad = start_client({"mode": "poll", "n": 40, "every": 0.1, **daemon.address_args(0)},
                       client_env(JOBSIGHT_JOB_ID=hostile, SLURM_JOB_ID=hostile, RANK="²"))
    time.sleep(0.5)
    replies = run_client({"mode": "poll", "n": 10, "every": 0.25, **daemon.address_args(0)},
                         client_env(JOBSIGHT_JOB_ID=neighbour, SLURM_JOB_ID=neighbour))
    bad_replies = result_of(bad)
    assert answered(replies) >= 9, replies  # the review saw 0 of 10: a traceback and a 1 s pause each
    assert answered(bad_replies) >= 36 and set(bad_replies) <= {"", None}, bad_replies
    assert daemon.service.status.errors == 0  # the rank is read as 0, nothing failed


# -- 2. traces that are not traces ----------------------------------------------------------------


def valid_trace(tag: str = "aten::mm", size: int = 0) -> str:
    events = [{"name": tag, "cat": "cpu_op", "ph": "X", "ts": 10 * i, "dur": 5, "pid": 1, "tid": 1} for i in range(3)]
    text = json.dumps({"traceEvents": events})
    return text + " " * max(0, size - len(text))


def poison_traces() -> dict[str, str]:
    deep = '{"traceEvents":' + "[" * 200_000 + "]" * 200_000 + "}"
    return {"not an object": '{"traceEvents":[1]}', "nested too deeply": deep}


def window_with(service: KinetoService, job: str, request_id: int, pid: int, text: str) -> Window:
    """A window as the service hands one out, its trace already written (under Kineto's name for it)."""
    directory = service.trace_root / job
    directory.mkdir(parents=True, exist_ok=True)
    window = Window(request_id, job, 0, pid, os.getuid(), directory, 3, time.monotonic())
    named = KinetoService._trace_path(window)
    named.with_name(f"{named.stem}_{pid}.json").write_text(text)
    return window


def test_a_trace_that_is_not_a_trace_fails_only_its_own_window(live_collector: Any, tmp_path: Path) -> None:
    from tests.frameworks.support import api

    daemon = Daemon(tmp_path, abstract=unique("jobsight-test"), url=live_collector.url, token=live_collector.token)
    try:
        job = unique("poison")
        daemon.shipper.enqueue({"kind": "job_started", "job": job, "ts": now_us(), "node": "hostile-node",
                                "user": "root", "uid": os.getuid(), "nodes": ["hostile-node"], "gpus": []})
        assert daemon.shipper.flush(20.0)
        daemon.register(job, os.getuid())
        ids = [int(api(live_collector, f"/v1/jobs/{job}/profile-requests", method="POST", body={"steps": 3})["id"])
               for _ in range(3)]
        service = daemon.service
        texts = [*poison_traces().values(), valid_trace()]
        windows = [window_with(service, job, request_id, 5000 + n, text) for n, (request_id, text) in
                   enumerate(zip(ids, texts, strict=True))]
        for window in windows:  # the poisoned ones first: they must not hold up the good one
            service._windows[window.pid] = window
        assert service.start(), service.status.message

        def states() -> dict[int, tuple[str, str | None]]:
            found = api(live_collector, f"/v1/jobs/{job}/profile-requests")["requests"]
            return {r["id"]: (r["state"], r.get("reason")) for r in found}

        final = wait_until("every window ended", lambda: (now := states()) and all(
            state in ("done", "failed") for state, _ in now.values()) and now, timeout=30)
        for request_id, why in zip(ids, poison_traces(), strict=False):
            state, reason = final[request_id]
            assert state == "failed" and reason and why in reason, final
        assert final[ids[2]][0] == "done", final
        profiles = api(live_collector, f"/v1/jobs/{job}/profiles")["profiles"]
        assert [p["pid"] for p in profiles] == [windows[2].pid]
        assert not service._windows and not list((daemon.trace_dir / job).iterdir())  # every file removed
    finally:
        daemon.stop()


def test_a_collecting_round_reads_a_bounded_number_of_traces(daemons: Callable[..., Daemon]) -> None:
    daemon = daemons(abstract=unique("jobsight-test"))
    service = daemon.service  # not started: the test runs the rounds itself
    job = unique("many")
    windows = [window_with(service, job, 700 + n, 6000 + n, valid_trace()) for n in range(5)]
    for window in windows:
        service._windows[window.pid] = window
    service._collect()  # notes each file's size (still being written?)
    shipped = []
    for _ in range(3):
        service._collect()
        shipped.append(service.status.profiles_shipped)
    assert shipped == [2, 4, 5]
    # The bytes too: with a 4 KiB cap, a 3 KB trace leaves no room for a second one in its round.
    small = daemons(abstract=unique("jobsight-test"), kineto_trace_cap_bytes=4096)
    for n in range(3):
        window = window_with(small.service, job, 800 + n, 7000 + n, valid_trace(size=3000))
        small.service._windows[window.pid] = window
    small.service._collect()
    counts = []
    for _ in range(3):
        small.service._collect()
        counts.append(small.service.status.profiles_shipped)
    assert counts == [1, 2, 3]


# -- 3. floods ------------------------------------------------------------------------------------


def test_a_user_flooding_the_daemon_does_not_starve_another_users_processes(
        daemons: Callable[..., Daemon]) -> None:
    daemon = daemons()  # the default: a socket per user
    daemon.register(unique("flood"), FLOOD_UID)
    daemon.register(unique("victim"), VICTIM_UID)
    assert daemon.service.start(), daemon.service.status.message
    daemon.wait_for_socket(FLOOD_UID)
    daemon.wait_for_socket(VICTIM_UID)
    # Blocking sends: the flooder is woken first whenever the daemon frees a slot of its queue.
    flooder = start_client({"mode": "flood", "uid": FLOOD_UID, "blocking": True, "seconds": 6,
                            **daemon.address_args(FLOOD_UID)})
    time.sleep(1.0)
    replies = run_client({"mode": "poll", "uid": VICTIM_UID, "n": 10, "every": 0.2,
                          **daemon.address_args(VICTIM_UID)})
    reach = run_client({"mode": "send", "uid": FLOOD_UID, "paths": [f"{daemon.user_dir(VICTIM_UID)}/dynolog"]})
    flood = result_of(flooder)
    assert flood["sent"] > 1000, flood  # it did flood
    assert answered(replies) >= 9, replies
    assert set(reach.values()) == {errno.EACCES}, reach  # another user's socket is out of its reach
    assert daemon.service.limit.dropped.get(FLOOD_UID, 0) > 0  # read past its rate, dropped unparsed


def test_on_the_abstract_name_a_flooding_uid_is_cut_to_its_rate(daemons: Callable[..., Daemon]) -> None:
    daemon = daemons(abstract=unique("jobsight-test"))  # the opt-in shared name: one queue for all
    assert daemon.service.start(), daemon.service.status.message
    seconds = 5.0
    flooder = start_client({"mode": "flood", "uid": FLOOD_UID, "blocking": False, "seconds": seconds,
                            **daemon.address_args(FLOOD_UID)})
    time.sleep(1.0)
    replies = run_client({"mode": "poll", "uid": VICTIM_UID, "n": 10, "every": 0.2,
                          **daemon.address_args(VICTIM_UID)})
    flood = result_of(flooder)
    status = daemon.service.status
    decided = sum(status.refused.values()) + status.configs_given
    rate, burst = 20.0, 40.0  # kineto/endpoint.py: RATE_PER_UID_S, BURST_PER_UID
    assert answered(replies) >= 8, replies
    # What the daemon judged of the flood is the flooder's rate over it, plus one burst: the rest
    # was read and dropped unparsed.
    assert decided <= rate * (seconds + 1) + burst + len(replies), (decided, flood, status.refused)
    assert flood["sent"] > 10 * decided, (flood, decided)
    limit = daemon.service.limit
    assert (limit.rate_per_s, limit.burst) == (rate, burst)
    assert limit.dropped.get(FLOOD_UID, 0) > flood["sent"] // 2


# -- 4. exact trace names -------------------------------------------------------------------------


def test_a_longer_pids_trace_is_not_taken_for_a_shorter_pid(daemons: Callable[..., Daemon]) -> None:
    service = daemons(abstract=unique("jobsight-test")).service
    job = unique("pids")
    long = window_with(service, job, 9, 123, valid_trace())  # request9_rank0_pid123_123.json
    short = Window(9, job, 0, 12, os.getuid(), long.directory, 3, time.monotonic())
    service._windows.update({12: short, 123: long})
    for _ in range(2):
        service._collect_one(12, short)
    assert service.status.profiles_shipped == 0 and 12 in service._windows
    assert [p.name for p in long.directory.iterdir()] == ["request9_rank0_pid123_123.json"]
    for _ in range(2):
        service._collect_one(123, long)
    assert service.status.profiles_shipped == 1 and 123 not in service._windows


# -- 5. where jobs look for the daemon ------------------------------------------------------------


def test_no_other_user_can_bind_where_jobs_look_even_across_a_restart(daemons: Callable[..., Daemon]) -> None:
    daemon = daemons()
    daemon.register(unique("victim"), VICTIM_UID)
    assert daemon.service.start(), daemon.service.status.message
    daemon.wait_for_socket(VICTIM_UID)
    top, mine = daemon.socket_dir, Path(daemon.user_dir(VICTIM_UID))
    assert (stat.S_IMODE(top.stat().st_mode), top.stat().st_uid) == (0o711, 0)
    assert (stat.S_IMODE(mine.stat().st_mode), mine.stat().st_uid) == (0o700, VICTIM_UID)
    socket_file = (mine / "dynolog").stat()
    assert (stat.S_IMODE(socket_file.st_mode), socket_file.st_uid) == (0o600, VICTIM_UID)

    daemon.service.stop()  # a restart: the window in which @dynolog could be taken by anyone
    squat = run_client({"mode": "bind", "uid": OTHER_UID,
                        "paths": [f"{top}/dynolog", f"{mine}/dynolog", f"{mine}/dynoconfigclient-x", f"{top}/x"]})
    assert set(squat.values()) == {errno.EACCES}, squat
    # The user itself may break its own socket (its directory is its own): only its processes lose.
    daemon.service = daemon.new_service()
    assert daemon.service.start(), daemon.service.status.message
    daemon.wait_for_socket(VICTIM_UID)
    # Reachability, not latency (the flood tests hold that): a loaded machine gets a second.
    replies = run_client({"mode": "poll", "uid": VICTIM_UID, "n": 3, "every": 0.1, "wait": 1.0,
                          **daemon.address_args(VICTIM_UID)})
    assert answered(replies) == 3, replies


def test_the_prolog_makes_a_users_socket_directory_before_its_tasks_start(daemons: Callable[..., Daemon]) -> None:
    from jobsight.agent.node.kineto.hooks import prepare_kineto_socket_dir

    daemon = daemons()
    daemon.socket_dir.rmdir()  # a node whose daemon has not started: nothing is made for it
    assert prepare_kineto_socket_dir(daemon.settings, VICTIM_UID) is None
    assert not daemon.socket_dir.exists()
    assert daemon.service.start(), daemon.service.status.message  # it has no job of that user yet
    made = prepare_kineto_socket_dir(daemon.settings, VICTIM_UID)
    assert made == daemon.user_dir(VICTIM_UID)
    info = Path(made).stat()
    assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o700, VICTIM_UID)
    # A task starting now can bind its client socket there (Kineto does it once, at start); no one else can.
    mine = run_client({"mode": "bind", "uid": VICTIM_UID, "paths": [f"{made}/dynoconfigclient-1"]})
    theirs = run_client({"mode": "bind", "uid": OTHER_UID, "paths": [f"{made}/dynoconfigclient-2"]})
    assert list(mine.values()) == ["ok"] and list(theirs.values()) == [errno.EACCES], (mine, theirs)
    abstract = daemons(abstract=unique("jobsight-test"))
    assert prepare_kineto_socket_dir(abstract.settings, VICTIM_UID) is None


def test_the_socket_files_are_the_default_and_the_abstract_name_is_opt_in() -> None:
    from jobsight.agent.node.kineto.hooks import kineto_socket_dir_for
    from jobsight.agent.settings import load_agent_settings

    default = load_agent_settings({})
    assert not default.kineto_uses_abstract_socket()
    assert kineto_socket_dir_for(default, 1000) == "/run/jobsight/kineto/1000"
    # An empty or overlong directory does not fall back to the abstract name: it keeps the default.
    for bad in ["", "relative/dir", "/" + "x" * 60]:
        settings = load_agent_settings({"JOBSIGHT_KINETO_SOCKET_DIR": bad})
        assert settings.kineto_socket_dir == "/run/jobsight/kineto", bad
        assert not settings.kineto_uses_abstract_socket()
    opted = load_agent_settings({"JOBSIGHT_KINETO_ABSTRACT_SOCKET": "1"})
    assert opted.kineto_uses_abstract_socket() and kineto_socket_dir_for(opted, 1000) is None
    longest = "/" + "d" * 39
    assert len(f"{longest}/4294967295/dynoconfigclient{uuid.uuid4()}".encode()) < 108


def test_kineto_serving_trusts_only_a_fresh_status_of_roots(daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    from jobsight.agent.node.kineto.hooks import kineto_serving

    daemon = daemons()
    status = daemon.service.status_file
    assert not kineto_serving(status)  # not started: no status
    assert daemon.service.start(), daemon.service.status.message
    wait_until("the status says serving", lambda: kineto_serving(status))
    assert not kineto_serving(status, now=time.time() + 31)  # a daemon killed 31 s ago
    assert not kineto_serving(status, now=time.time() - 60)  # a stamp from the future
    link = tmp_path / "link.json"
    link.symlink_to(status)
    assert not kineto_serving(link)
    copy = tmp_path / "copy.json"
    shutil.copy(status, copy)
    assert kineto_serving(copy)
    os.chown(copy, OTHER_UID, -1)  # written by someone else than root
    assert not kineto_serving(copy)
    for text in ["", "[]", "{", '{"kineto": {"serving": "yes"}, "updated_at": 1e18}',
                 json.dumps({"kineto": {"serving": True}, "updated_at": True})]:
        copy.write_text(text)
        os.chown(copy, 0, -1)
        assert not kineto_serving(copy), text
    (tmp_path / "dir.json").mkdir()
    assert not kineto_serving(tmp_path / "dir.json")
    daemon.service.stop()
    assert not kineto_serving(status)  # a stopped daemon says so at once


def test_removing_a_jobs_traces_follows_no_link_the_user_planted(tmp_path: Path) -> None:
    from jobsight.agent.node.kineto.hooks import remove_job_traces

    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "keep.txt").write_text("keep")
    (outside / "deep" / "keep.txt").write_text("keep")
    traces = tmp_path / "traces"
    job = traces / "42"
    (job / "a" / "b").mkdir(parents=True)
    (job / "a" / "b" / "trace.json").write_text("{}")
    (job / "to_dir").symlink_to(outside)
    (job / "a" / "to_file").symlink_to(outside / "keep.txt")
    (job / "a" / "b" / "to_deep").symlink_to(outside / "deep")
    os.mkfifo(job / "fifo")
    for path in [job, *job.rglob("*")]:
        os.lchown(path, VICTIM_UID, VICTIM_UID)
    (traces / "43").symlink_to(outside)  # a link under the trace root itself is removed, not followed
    remove_job_traces(str(traces), "42")
    remove_job_traces(str(traces), "43")
    assert sorted(p.name for p in traces.iterdir()) == []
    assert sorted(str(p.relative_to(outside)) for p in outside.rglob("*")) == ["deep", "deep/keep.txt", "keep.txt"]
    for job_name in ["..", "../outside", "a/b", ""]:
        remove_job_traces(str(traces), job_name)  # refused, never raised
    remove_job_traces(str(tmp_path / "missing"), "42")
    assert (outside / "keep.txt").read_text() == "keep"


def test_kineto_writes_its_traces_where_no_other_user_reads_them(daemons: Callable[..., Daemon]) -> None:
    from jobsight.agent.node.kineto.traces import prepare_job_dir

    unit = (REPO / "slurm" / "jobsight-agent.service").read_text().splitlines()
    settings = dict(line.split("=", 1) for line in unit if "=" in line and not line.startswith("#"))
    assert settings["StateDirectoryMode"] == "0711"
    assert set(settings["StateDirectory"].split()) == {"jobsight", "jobsight/traces"}
    # The state directory as systemd makes it, with the daemon's spool and trace root inside.
    state = short_dir()
    try:
        state.chmod(0o711)
        (state / "spool").mkdir(mode=0o700)
        (state / "spool" / "batch").write_text("private")
        daemon = daemons(abstract=unique("jobsight-test"), kineto_trace_dir=str(state / "traces"))
        assert daemon.service.start(), daemon.service.status.message
        assert "warning" not in daemon.service.status.message
        assert stat.S_IMODE((state / "traces").stat().st_mode) == 0o711
        job = unique("traces")
        directory = prepare_job_dir(state / "traces", job, VICTIM_UID)
        assert (stat.S_IMODE(directory.stat().st_mode), directory.stat().st_uid) == (0o700, VICTIM_UID)
        written = subprocess.run([sys.executable, "-I", "-c", (
            "import os, sys; os.setgroups([]); os.setgid(int(sys.argv[1])); os.setuid(int(sys.argv[1])); "
            "open(sys.argv[2], 'w').write('{}')"), str(VICTIM_UID), f"{directory}/trace.json"], capture_output=True)
        assert written.returncode == 0, written.stderr  # Kineto, as the job's user, writes its trace
        others = subprocess.run([sys.executable, "-I", "-c", (
            "import json, os, sys; os.setgroups([]); os.setgid(int(sys.argv[1])); os.setuid(int(sys.argv[1]))\n"
            "found = {}\n"
            "for what, path in json.loads(sys.argv[2]):\n"
            "    try:\n"
            "        os.listdir(path) if what == 'list' else open(path).read()\n"
            "        found[path] = 'ok'\n"
            "    except OSError as exc:\n"
            "        found[path] = exc.errno\n"
            "print(json.dumps(found))"), str(OTHER_UID), json.dumps([
                ["list", str(state)], ["list", str(state / "traces")], ["list", str(directory)],
                ["read", f"{directory}/trace.json"], ["list", str(state / "spool")],
                ["read", str(state / "spool" / "batch")]])], capture_output=True, text=True)
        assert others.returncode == 0, others.stderr
        assert set(json.loads(others.stdout).values()) == {errno.EACCES}, others.stdout
    finally:
        shutil.rmtree(state, ignore_errors=True)


TRAINING_AS_USER = r"""
import ctypes, os, sys, time
os.setgroups([])
os.setgid(int(sys.argv[1]))
os.setuid(int(sys.argv[1]))
ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE, as a process slurmstepd execs as the user
import torch
model = torch.nn.Linear(32, 32)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
batch = torch.randn(16, 32)
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    optimizer.zero_grad()
    model(batch).sum().backward()
    optimizer.step()
    time.sleep(0.02)
"""


def test_a_real_pytorch_process_of_a_user_is_profiled_through_its_own_socket(live_collector: Any) -> None:
    """The whole default path as a job's user (not root) lives it: its socket directory and socket,
    its trace directory, Kineto writing there, the daemon reading it."""
    pytest.importorskip("torch")
    from jobsight.agent.node.kineto.hooks import kineto_socket_dir_for, prepare_kineto_socket_dir
    from tests.frameworks.support import api

    root = short_dir()
    daemon = Daemon(root, url=live_collector.url, token=live_collector.token)
    try:
        job = unique("user")
        daemon.shipper.enqueue({"kind": "job_started", "job": job, "ts": now_us(), "node": "hostile-node",
                                "user": "victim", "uid": VICTIM_UID, "nodes": ["hostile-node"], "gpus": []})
        assert daemon.shipper.flush(20.0)
        assert daemon.service.start(), daemon.service.status.message
        socket_dir = prepare_kineto_socket_dir(daemon.settings, VICTIM_UID)  # the prolog
        daemon.register(job, VICTIM_UID)
        assert socket_dir == kineto_socket_dir_for(daemon.settings, VICTIM_UID)
        request = int(api(live_collector, f"/v1/jobs/{job}/profile-requests", method="POST", body={"steps": 3})["id"])
        config = root / "libkineto.conf"
        config.write_text("ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=1\n")  # polls every second: a short test
        env = client_env(KINETO_USE_DAEMON="1", KINETO_IPC_SOCKET_DIR=socket_dir, KINETO_CONFIG=str(config),
                         KINETO_ONDEMAND_TRACE_DIR=str(daemon.trace_dir / job), JOBSIGHT_JOB_ID=job,
                         HOME=str(root))
        process = subprocess.Popen([sys.executable, "-c", TRAINING_AS_USER, str(VICTIM_UID), "60"], env=env,
                                   cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            profiles = wait_until("a profile of the user's process", lambda: api(
                live_collector, f"/v1/jobs/{job}/profiles")["profiles"], timeout=45)
        finally:
            process.kill()
            output = process.communicate(timeout=30)[0]
        assert (profiles[0]["pid"], profiles[0]["request_id"]) == (process.pid, request), output[-2000:]
        trace_dir = (daemon.trace_dir / job).stat()
        assert (stat.S_IMODE(trace_dir.st_mode), trace_dir.st_uid) == (0o700, VICTIM_UID)
    finally:
        daemon.stop()
        shutil.rmtree(root, ignore_errors=True)


# -- 6. the job is the cgroup's -------------------------------------------------------------------


def fake_process(proc_root: Path, pid: int, cgroup: str, **env: str) -> None:
    """``/proc/<pid>`` as the service reads it: its cgroup file and environment."""
    (proc_root / str(pid)).mkdir(parents=True)
    (proc_root / str(pid) / "cgroup").write_text(cgroup)
    (proc_root / str(pid) / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))


def ask_twice(service: KinetoService, pid: int) -> str | None:
    """A process's second poll (its first is only noted), as the endpoint hands it to the service."""
    request = parse_datagram(encode_request(0, (pid, 1)))
    creds = Credentials(pid, os.getuid(), os.getgid())
    service.decide(request, creds)
    return service.decide(request, creds)


CGROUPS = {
    "v2": "0::/system.slice/slurmstepd.scope/job_{id}/step_0/user/task_0\n",
    "v2, several slurmd": "0::/system.slice/node7_slurmstepd.scope/job_{id}/step_batch/user/task_0\n",
    "v1": ("12:pids:/slurm/uid_0/job_{id}/step_0/task_0\n5:memory:/slurm/uid_0/job_{id}/step_0/task_0\n"
           "1:name=systemd:/system.slice/slurmd.service\n0::/\n"),
    # A job may make cgroups of its own below its step: a "job_<other>" there is not its job.
    "v2, a job's own sub-cgroup": "0::/system.slice/slurmstepd.scope/job_{id}/step_0/user/job_{other}/x\n",
}


@pytest.mark.parametrize("layout", list(CGROUPS))
def test_the_job_comes_from_the_cgroup_not_the_environment(daemons: Callable[..., Daemon], tmp_path: Path,
                                                           layout: str) -> None:
    proc_root = tmp_path / "proc"
    daemon = daemons(abstract=unique("jobsight-test"))
    service = daemon.new_service(proc_root=str(proc_root))
    mine, other = "4201", "4202"  # two jobs of one user
    for job in (mine, other):
        daemon.register(job, os.getuid())
    service.trace_root.mkdir(parents=True, exist_ok=True)
    service._refresh()
    service._pending = {mine: [PendingRequest(1, 3, None)], other: [PendingRequest(2, 3, None)]}
    # The process is job 4201's (its cgroup) and says it is 4202's (its environment).
    fake_process(proc_root, 31337, CGROUPS[layout].format(id=mine, other=other), JOBSIGHT_JOB_ID=other,
                 SLURM_JOB_ID=other)
    config = ask_twice(service, 31337)
    assert config is not None and "request1_" in config, config
    assert "request2_" not in config


def test_a_process_in_slurm_but_in_no_single_job_is_refused_and_outside_slurm_its_environment_counts(
        daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    proc_root = tmp_path / "proc"
    daemon = daemons(abstract=unique("jobsight-test"))
    service = daemon.new_service(proc_root=str(proc_root))
    daemon.register("4301", os.getuid())
    service.trace_root.mkdir(parents=True, exist_ok=True)
    service._refresh()
    service._pending = {"4301": [PendingRequest(3, 3, None)]}
    env = {"JOBSIGHT_JOB_ID": "4301"}
    fake_process(proc_root, 1001, "0::/system.slice/slurmstepd.scope/system\n", **env)  # slurmstepd's own
    fake_process(proc_root, 1002, "4:memory:/slurm/uid_0/job_4301/step_0\n5:cpuset:/slurm/uid_0/job_4399/step_0\n",
                 **env)  # two jobs at once: which one?
    fake_process(proc_root, 1003, "0::/user.slice/user-0.slice/session-1.scope\n", **env)  # outside Slurm
    assert ask_twice(service, 1001) is None
    assert ask_twice(service, 1002) is None
    assert service.status.refused.get("in no single Slurm job's cgroup") == 4
    config = ask_twice(service, 1003)
    assert config is not None and "request3_" in config


def test_an_array_task_is_found_by_slurms_own_id(daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    from jobsight.agent.node.registrations import read_registration

    proc_root = tmp_path / "proc"
    daemon = daemons(abstract=unique("jobsight-test"))
    service = daemon.new_service(proc_root=str(proc_root))
    daemon.register("4400_3", os.getuid(), slurm_job_id=4405)  # the array task, Slurm's job 4405
    daemon.register("4405", os.getuid())  # an older prolog's file that happens to bear the number
    assert read_registration(daemon.registration_dir, "4400_3").slurm_job_id == 4405  # type: ignore[union-attr]
    # Without it, the file is what a prolog that knew no slurm_job_id wrote, and it still reads.
    assert "slurm_job_id" not in json.loads((daemon.registration_dir / "4405.json").read_text())
    assert read_registration(daemon.registration_dir, "4405").slurm_job_id is None  # type: ignore[union-attr]
    service.trace_root.mkdir(parents=True, exist_ok=True)
    service._refresh()
    service._pending = {"4400_3": [PendingRequest(5, 3, None)], "4405": [PendingRequest(6, 3, None)]}
    fake_process(proc_root, 2001, "0::/system.slice/slurmstepd.scope/job_4405/step_0/user/task_0\n",
                 SLURM_ARRAY_JOB_ID="4400", SLURM_ARRAY_TASK_ID="3", SLURM_JOB_ID="4405")
    config = ask_twice(service, 2001)
    assert config is not None and "request5_" in config and "/4400_3/" in config, config


def test_a_process_in_a_sluid_folder_is_served_as_the_job_whose_registration_holds_that_sluid(
        daemons: Callable[..., Daemon], tmp_path: Path) -> None:
    """Slurm 26.05's cgroup v2 names the job's folder by its SLUID (src/plugins/cgroup/v2/cgroup_v2.c:1934-1936):
    the service serves the job whose registration holds it (the prolog's ``SLURM_JOB_SLUID``), and no
    job whose registration does not, whatever number or environment the process claims."""
    proc_root = tmp_path / "proc"
    daemon = daemons(abstract=unique("jobsight-test"))
    service = daemon.new_service(proc_root=str(proc_root))
    daemon.register("4601", os.getuid(), slurm_job_id=4601, sluid="s8FXKTA79XAR00")
    daemon.register("4602", os.getuid(), slurm_job_id=4602)  # no SLUID registered: never matched to a folder
    service.trace_root.mkdir(parents=True, exist_ok=True)
    service._refresh()
    service._pending = {"4601": [PendingRequest(9, 3, None)], "4602": [PendingRequest(10, 3, None)]}
    fake_process(proc_root, 4700, "0::/system.slice/slurmstepd.scope/s8FXKTA79XAR00/step_batch/user/task_0\n",
                 JOBSIGHT_JOB_ID="4602", SLURM_JOB_ID="4602")
    config = ask_twice(service, 4700)
    assert config is not None and "request9_" in config and "/4601/" in config, config
    fake_process(proc_root, 4701, "0::/system.slice/slurmstepd.scope/s8FXKTA79XAR01/step_batch/user/task_0\n",
                 JOBSIGHT_JOB_ID="4602", SLURM_JOB_ID="4602")
    assert ask_twice(service, 4701) is None
    assert service.status.refused.get("job not registered here") == 2


FREEZER = Path("/sys/fs/cgroup/freezer")


@pytest.fixture
def slurm_cgroup() -> Iterator[Callable[[int, int], Path]]:
    """Real cgroup v1 directories laid out as Slurm's (``/slurm_<x>/uid_<u>/job_<id>/step_0``), in the
    freezer hierarchy (never frozen); removed afterwards. Skipped where cgroups cannot be made."""
    made: list[Path] = []
    top = FREEZER / f"slurm_jstest{uuid.uuid4().hex[:8]}"

    def make(uid: int, job: int) -> Path:
        step = top / f"uid_{uid}" / f"job_{job}" / "step_0"
        try:
            step.mkdir(parents=True)
        except OSError as exc:
            pytest.skip(f"cannot make a cgroup here: {exc}")
        made.extend([step, step.parent, step.parent.parent])
        return step

    if not FREEZER.is_dir():
        pytest.skip("no cgroup v1 freezer hierarchy on this host")
    yield make
    for path in [*made, top]:
        try:
            path.rmdir()
        except OSError:
            pass


def test_a_real_process_in_a_slurm_cgroup_cannot_pose_as_another_of_its_users_jobs(
        daemons: Callable[..., Daemon], tmp_path: Path, slurm_cgroup: Callable[[int, int], Path]) -> None:
    daemon = daemons(abstract=unique("jobsight-test"))
    service = daemon.service  # not started: the test serves the endpoint itself, with fixed requests
    mine, other = 4501, 4502
    step = slurm_cgroup(os.getuid(), mine)
    for job in (mine, other):
        daemon.register(str(job), os.getuid())
    service.trace_root.mkdir(parents=True, exist_ok=True)
    service._refresh()
    service._pending = {str(mine): [PendingRequest(7, 3, None)], str(other): [PendingRequest(8, 3, None)]}
    go = tmp_path / "go"
    process = start_client({"mode": "poll", "n": 3, "every": 0.05, "wait": 2.0, "wait_for": str(go),
                            **daemon.address_args(0)}, client_env(JOBSIGHT_JOB_ID=str(other), SLURM_JOB_ID=str(other)))
    try:
        (step / "cgroup.procs").write_text(str(process.pid))  # what slurmstepd does with a task
        assert f"job_{mine}" in Path(f"/proc/{process.pid}/cgroup").read_text()
        with KinetoEndpoint(daemon.abstract or "") as endpoint:
            go.touch()
            deadline = time.monotonic() + 20
            while process.poll() is None and time.monotonic() < deadline:
                endpoint.serve_once(0.1, service.decide)
        replies = result_of(process)
    finally:
        process.kill()
        process.wait()
    configs = [reply for reply in replies if reply]
    assert len(configs) == 1 and "request7_" in configs[0] and f"/{mine}/" in configs[0], replies
