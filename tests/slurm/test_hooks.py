"""``jobsight slurm prolog|task-prolog|epilog`` as real processes with Slurm's environment,
against a real collector, and with the collector stopped."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobsight.protocol.tokens import verify_token
from jobsight.protocol.wire import encode_batch, now_us
from tests.conftest import REPO, LiveCollector
from tests.slurm.squeue_stub import squeue_stub

SECRET = "hooks-test-secret-abcdef0123456789"
# Runs well under this on an idle machine; the bound catches a hook that waits on a dead collector.
HOOK_BUDGET_S = 3.0


@pytest.fixture
def hook_env(tmp_path: Path) -> dict[str, str]:
    secret = tmp_path / "cluster_secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    return {
        "JOBSIGHT_SECRET_FILE": str(secret),
        "JOBSIGHT_TOKEN_DIR": str(tmp_path / "tokens"),
        "JOBSIGHT_REGISTRATION_DIR": str(tmp_path / "jobs"),
        "JOBSIGHT_SPOOL_DIR": str(tmp_path / "spool"),
        "JOBSIGHT_HOOK_LOG": str(tmp_path / "hooks.log"),
        "JOBSIGHT_SQUEUE": squeue_stub(tmp_path, {"name": "my job", "time_limit": 30}),
        "JOBSIGHT_CLUSTER": "default",
    }


@pytest.fixture
def collector(
    database_url: str, data_dir: Path, admin_token: str, tmp_path: Path, hook_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[LiveCollector]:
    """A live collector that knows the cluster secret."""
    monkeypatch.setenv("JOBSIGHT_SECRET_FILE", hook_env["JOBSIGHT_SECRET_FILE"])
    live = LiveCollector(database_url, data_dir, admin_token, tmp_path / "collector.log")
    live.start()
    yield live
    live.kill()


def job_uid() -> int:
    return 65534 if os.geteuid() == 0 else os.getuid()


def slurm_env(job: str, hook: str, gpus: str = "0,1", **extra: str) -> dict[str, str]:
    """What slurmd gives the prolog/epilog (tests/slurm/NOTES.md), without PATH or HOME."""
    env = {
        "SLURM_JOB_ID": job, "SLURM_JOBID": job, "SLURMD_NODENAME": "vm", "SLURM_CLUSTER_NAME": "jobsight-test",
        "SLURM_JOB_USER": "nobody", "SLURM_JOB_UID": str(job_uid()), "SLURM_JOB_GID": str(job_uid()),
        "SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_ACCOUNT": "acct1", "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NODELIST": "vm", "SLURM_JOB_GPUS": gpus, "CUDA_VISIBLE_DEVICES": gpus,
        "SLURM_SCRIPT_CONTEXT": f"{hook}_slurmd", "SLURM_JOB_RESTART_COUNT": "0",
    }
    env.update(extra)
    return env


def run_hook(hook: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "jobsight", "slurm", hook], env=env, cwd="/", text=True,
                            capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    return result, time.monotonic() - started


def new_job() -> str:
    return str(900_000_000 + uuid.uuid4().int % 99_999_999)


def ingest(url: str, token: str, records: list[dict[str, Any]]) -> int:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"{url}/v1/ingest", data=encode_batch(f"hooks-test-{uuid.uuid4()}", 1, records),
                                     headers={"Content-Encoding": "gzip", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_prolog_task_prolog_epilog(collector: LiveCollector, hook_env: dict[str, str], db: Any) -> None:
    job = new_job()
    env = {**hook_env, "JOBSIGHT_URL": collector.url}

    # Slurm 26.05 gives the prolog the run's SLUID (SLURM_JOB_SLUID); 22.05 none (the other tests here).
    result, took = run_hook("prolog", {**env, **slurm_env(job, "prolog", SLURM_JOB_SLUID=SLUID)})
    assert result.returncode == 0 and result.stdout == "", result.stderr
    assert took < HOOK_BUDGET_S

    token_file = Path(env["JOBSIGHT_TOKEN_DIR"]) / f"{job}.token"
    info = token_file.stat()
    assert stat.S_IMODE(info.st_mode) == 0o400 and info.st_uid == job_uid()
    assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o711
    claims = verify_token(SECRET, token_file.read_text().strip())
    assert (claims.kind, claims.job, claims.cluster, claims.uid) == ("job", job, "default", job_uid())
    # Time limit (30 min from scontrol) plus the default grace of an hour.
    assert abs(claims.expires_at - (time.time() + 1800 + 3600)) < 60

    from jobsight.agent.node.registrations import Registration

    registration = Registration.from_file(Path(env["JOBSIGHT_REGISTRATION_DIR"]) / f"{job}.json")
    assert (registration.node, registration.gpus, registration.uid) == ("vm", (0, 1), job_uid())
    assert (registration.time_limit_s, registration.token_file) == (1800, str(token_file))
    assert registration.sluid == SLUID

    row = db.execute("SELECT user_name, uid, account, partition, nodes, gpus, node_count, time_limit_s, state, name "
                     "FROM jobs WHERE job_id = %s", (job,)).fetchone()
    assert row == ("nobody", job_uid(), "acct1", "gpu", ["vm"], ["vm:0", "vm:1"], 1, 1800, "running", "my job")
    assert _stored_sluid(db, job) == SLUID

    # The task prolog runs as the job's user with the job's environment: one export per line.
    task_env = {**env, **slurm_env(job, "prolog_task"), "SLURM_JOB_NAME": "train"}
    result, _ = run_hook("task-prolog", task_env)
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    # No node daemon says it serves PyTorch's profiler here: nothing points the job at a socket. The job's
    # processes record Slurm's node name (SLURMD_NODENAME), not their host name.
    assert lines == [f"export JOBSIGHT_URL={collector.url}", "export JOBSIGHT_CLUSTER=default",
                     f"export JOBSIGHT_JOB_ID={job}", "export JOBSIGHT_NODE=vm",
                     f"export JOBSIGHT_TOKEN={token_file.read_text().strip()}"]
    token = lines[-1].split("=", 1)[1]
    # While the daemon's (root's) status says, freshly, that it serves: KINETO_USE_DAEMON and the
    # user's own socket directory, unless the site turns it off or the job set it itself.
    status = Path(env["JOBSIGHT_REGISTRATION_DIR"]).parent / "agent-status.json"
    status.write_text(json.dumps({"kineto": {"serving": True}, "updated_at": time.time()}))
    result, _ = run_hook("task-prolog", task_env)
    assert result.stdout.splitlines()[4:7] == [
        "export KINETO_USE_DAEMON=1", f"export KINETO_IPC_SOCKET_DIR=/run/jobsight/kineto/{os.getuid()}",
        f"export KINETO_ONDEMAND_TRACE_DIR=/var/lib/jobsight/traces/{job}"]
    result, _ = run_hook("task-prolog", {**task_env, "JOBSIGHT_KINETO_DAEMON": "0"})
    assert "export KINETO_USE_DAEMON=1" not in result.stdout.splitlines()
    result, _ = run_hook("task-prolog", {**task_env, "KINETO_USE_DAEMON": "0"})
    assert "export KINETO_USE_DAEMON=1" not in result.stdout.splitlines()
    log = {"kind": "log", "job": job, "ts": now_us(), "level": "INFO", "message": "from the job"}
    assert ingest(collector.url, token, [log]) == 200
    assert ingest(collector.url, token, [{**log, "job": new_job()}]) == 403
    # The SLUID is the prolog's: a job token can neither set it nor overwrite it through its run metadata.
    metadata = {"kind": "job_started", "job": job, "ts": now_us(), "attrs": {"sluid": "s0000000000000", "lr": 1}}
    assert ingest(collector.url, token, [{**metadata, "sluid": "s0000000000000"}]) == 403
    assert ingest(collector.url, token, [metadata]) == 200
    assert _stored_sluid(db, job) == SLUID

    traces = Path(env["JOBSIGHT_TOKEN_DIR"]).parent / "traces"
    (traces / job).mkdir(parents=True)
    (traces / job / "left_pid7.json").write_text("{}")
    result, took = run_hook("epilog", {**env, **slurm_env(job, "epilog", SLURM_JOB_EXIT_CODE="768",
                                                          SLURM_JOB_EXIT_CODE2="3:0"),
                                       "JOBSIGHT_KINETO_TRACE_DIR": str(traces)})
    assert result.returncode == 0 and took < HOOK_BUDGET_S
    assert not token_file.exists()
    assert not (traces / job).exists() and traces.exists()  # the job's trace directory goes with it
    assert not (Path(env["JOBSIGHT_REGISTRATION_DIR"]) / f"{job}.json").exists()
    row = db.execute("SELECT state, exit_code, end_time IS NOT NULL FROM jobs WHERE job_id = %s", (job,)).fetchone()
    assert row == ("failed", 3, True)
    assert db.execute("SELECT gpu_count FROM job_summaries WHERE job_id = %s", (job,)).fetchone() == (2,)


SLUID = "s8FXKTA79XAR00"


def _stored_sluid(db: Any, job: str) -> str | None:
    row = db.execute("SELECT attrs->>'sluid' FROM jobs WHERE job_id = %s", (job,)).fetchone()
    return None if row is None else row[0]


def test_collector_away_hooks_exit_fast_and_spool(
    collector: LiveCollector, hook_env: dict[str, str], db: Any
) -> None:
    env = {**hook_env, "JOBSIGHT_URL": collector.url}
    job = new_job()
    collector.stop()

    result, took = run_hook("prolog", {**env, **slurm_env(job, "prolog")})
    assert result.returncode == 0 and took < HOOK_BUDGET_S
    assert (Path(env["JOBSIGHT_TOKEN_DIR"]) / f"{job}.token").exists()
    assert (Path(env["JOBSIGHT_REGISTRATION_DIR"]) / f"{job}.json").exists()
    result, took = run_hook("epilog", {**env, **slurm_env(job, "epilog", SLURM_JOB_EXIT_CODE2="0:0")})
    assert result.returncode == 0 and took < HOOK_BUDGET_S
    segments = list(Path(env["JOBSIGHT_SPOOL_DIR"]).glob("*.seg"))
    assert len(segments) == 2, "each hook leaves one fsynced segment"
    assert "unavailable" in Path(env["JOBSIGHT_HOOK_LOG"]).read_text()
    assert db.execute("SELECT count(*) FROM jobs WHERE job_id = %s", (job,)).fetchone()[0] == 0

    # Back up: the next hook on the node (here another job's prolog) replays what was spooled.
    collector.start()
    other = new_job()
    result, _ = run_hook("prolog", {**env, **slurm_env(other, "prolog", gpus="2,3")})
    assert result.returncode == 0
    row = db.execute("SELECT state, exit_code, gpus FROM jobs WHERE job_id = %s", (job,)).fetchone()
    assert row == ("completed", 0, ["vm:0", "vm:1"])
    assert db.execute("SELECT count(*) FROM job_summaries WHERE job_id = %s", (job,)).fetchone()[0] == 1
    assert list(Path(env["JOBSIGHT_SPOOL_DIR"]).glob("*.seg")) == []


def test_unreachable_address_is_bounded(hook_env: dict[str, str]) -> None:
    """A collector address that never answers (non-routable): the 1 s timeout bounds the hook."""
    env = {**hook_env, "JOBSIGHT_URL": "http://10.255.255.1:8787"}
    result, took = run_hook("prolog", {**env, **slurm_env(new_job(), "prolog")})
    assert result.returncode == 0 and took < HOOK_BUDGET_S


@pytest.mark.parametrize("hook", ["prolog", "epilog", "task-prolog"])
def test_hooks_exit_zero_whatever_happens(hook_env: dict[str, str], tmp_path: Path, hook: str) -> None:
    """No job id, an unreadable secret, an unwritable token dir: still 0, and the log says why."""
    env = {**hook_env, "JOBSIGHT_SECRET_FILE": str(tmp_path / "missing"), "JOBSIGHT_TOKEN_DIR": "/proc/nope",
           "JOBSIGHT_URL": "http://127.0.0.1:1"}
    result, _ = run_hook(hook, {k: v for k, v in {**env, **slurm_env("", hook)}.items() if v})
    assert result.returncode == 0 and result.stdout == ""
    assert "SLURM_JOB_ID" in Path(env["JOBSIGHT_HOOK_LOG"]).read_text()
    result, _ = run_hook(hook, {**env, **slurm_env(new_job(), hook)})
    assert result.returncode == 0
    if hook == "task-prolog":
        assert "export JOBSIGHT_TOKEN" not in result.stdout and "export JOBSIGHT_JOB_ID" in result.stdout


def test_report_cli(collector: LiveCollector, hook_env: dict[str, str]) -> None:
    env = {**os.environ, **hook_env, "JOBSIGHT_URL": collector.url, "JOBSIGHT_TOKEN": collector.token}
    job = new_job()
    run_hook("prolog", {**hook_env, "JOBSIGHT_URL": collector.url, **slurm_env(job, "prolog")})
    run_hook("epilog", {**hook_env, "JOBSIGHT_URL": collector.url, **slurm_env(job, "epilog")})
    report = subprocess.run([sys.executable, "-m", "jobsight", "report", job], env=env, cwd=REPO, text=True,
                            capture_output=True, timeout=30)
    assert report.returncode == 0, report.stderr
    assert f"Job ID: {job}" in report.stdout and "Dashboard: http" in report.stdout
    missing = subprocess.run([sys.executable, "-m", "jobsight", "report", "no-such-job"], env=env, cwd=REPO,
                             text=True, capture_output=True, timeout=30)
    assert missing.returncode == 1
    assert missing.stderr.strip() == ("jobsight report: job no-such-job not found in cluster default; "
                                      "no cluster of this collector has a job with this id")
    away = subprocess.run([sys.executable, "-m", "jobsight", "report", job], env={**env, "JOBSIGHT_URL":
                          "http://127.0.0.1:1"}, cwd=REPO, text=True, capture_output=True, timeout=30)
    assert away.returncode == 1 and len(away.stderr.strip().splitlines()) == 1
    assert "cannot reach the collector at http://127.0.0.1:1" in away.stderr


def _squeue_in_prefix(prefix: Path, **job: Any) -> Path:
    """``<prefix>/bin/squeue`` answering as Slurm 26.05 does (data_parser v0.0.45): the asked job only
    with ``--states=all``, else none. It writes its arguments and ``SLURM_CONF`` to ``<prefix>/called``."""
    from tests.agent.test_squeue_fields import SLURM_26_05

    answer = json.dumps({"jobs": [{**SLURM_26_05, **job, "job_id": 123456789}], "errors": [], "warnings": []})
    head, tail = answer.split("123456789", 1)
    (prefix / "bin").mkdir(parents=True)
    (prefix / "etc").mkdir()
    script = prefix / "bin" / "squeue"
    script.write_text(f"""#!/bin/sh
printf '%s SLURM_CONF=%s\\n' "$*" "${{SLURM_CONF:-}}" >> {prefix / "called"}
case " $* " in
    *" --states=all "*) printf '%s%s%s\\n' '{head}' "$3" '{tail}' ;;
    *) echo '{{"jobs": [], "errors": [], "warnings": []}}' ;;
esac
""")
    script.chmod(0o755)
    return script


def test_hooks_ask_the_squeue_of_slurmds_slurm_conf_for_ended_jobs_too(
    collector: LiveCollector, hook_env: dict[str, str], db: Any, tmp_path: Path
) -> None:
    """A Slurm installed under a prefix (/opt/slurm-26.05 in CI): slurmd's SLURM_CONF names it, the hooks
    run its squeue with that SLURM_CONF (not /usr/bin/squeue, not a configuration found by luck), and ask
    with ``--states=all``, without which 26.05 answers no ended job."""
    prefix = tmp_path / "slurm-26.05"
    squeue = _squeue_in_prefix(prefix, time_limit={"set": True, "infinite": False, "number": 45})
    conf = str(prefix / "etc" / "slurm.conf")
    env = {k: v for k, v in hook_env.items() if k != "JOBSIGHT_SQUEUE"}
    if os.geteuid() != 0:  # only root's own squeue is found beside SLURM_CONF; hooks.env can name any
        env["JOBSIGHT_SQUEUE"] = str(squeue)
    env.update({"JOBSIGHT_URL": collector.url, "SLURM_CONF": conf})
    job = new_job()
    result, _ = run_hook("prolog", {**env, **slurm_env(job, "prolog")})
    assert result.returncode == 0
    row = db.execute("SELECT time_limit_s FROM jobs WHERE job_id = %s", (job,)).fetchone()
    assert row == (2700,), Path(env["JOBSIGHT_HOOK_LOG"]).read_text()
    # The batch script's status says nothing (0:0); Slurm's answer says FAILED, exit 3.
    result, _ = run_hook("epilog", {**env, **slurm_env(job, "epilog", SLURM_JOB_EXIT_CODE2="0:0")})
    assert result.returncode == 0
    assert db.execute("SELECT state, exit_code FROM jobs WHERE job_id = %s", (job,)).fetchone() == ("failed", 3)
    calls = (prefix / "called").read_text().splitlines()
    assert calls == [f"--json -j {job} --states=all SLURM_CONF={conf}"] * 2


# -- the wrappers (slurm/prolog, epilog, task_prolog) ------------------------------------------------


def _wrapper_env_seen(tmp_path: Path, wrapper: Path) -> dict[str, str]:
    """Run ``wrapper`` as slurmd does (by its absolute path, Slurm's variables only) and return the
    environment its ``JOBSIGHT_BIN`` got, with ``ARGS``; ``{}`` when it was not run."""
    seen = tmp_path / "seen"
    seen.unlink(missing_ok=True)
    subprocess.run([str(wrapper)], env={"SLURM_CONF": "/opt/slurm-26.05/etc/slurm.conf", "SLURMD_NODENAME": "vm"},
                   cwd="/", capture_output=True, timeout=30, stdin=subprocess.DEVNULL, check=True)
    if not seen.exists():
        return {}
    args, *lines = seen.read_text().splitlines()
    return {"ARGS": args, **dict(line.split("=", 1) for line in lines if "=" in line)}


def _stub_jobsight(tmp_path: Path) -> Path:
    stub = tmp_path / "jobsight-stub"
    stub.write_text(f"#!/bin/sh\n{{ printf '%s\\n' \"$*\"; /usr/bin/env; }} > {tmp_path / 'seen'}\n")
    stub.chmod(0o755)
    return stub


WRAPPERS = {"prolog": "prolog", "epilog": "epilog", "task_prolog": "task-prolog"}


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_a_wrapper_reads_the_hooks_env_beside_it_and_keeps_slurm_conf(tmp_path: Path, wrapper: str) -> None:
    """The wrapper as shipped, installed in a directory of its own with a hooks.env beside it: that file's
    JOBSIGHT_BIN is the one run (over /etc/jobsight/hooks.env's, where this host has one), with slurmd's
    SLURM_CONF in its environment."""
    libexec = tmp_path / "libexec"
    libexec.mkdir()
    installed = libexec / wrapper
    installed.write_text((REPO / "slurm" / wrapper).read_text())
    installed.chmod(0o755)
    (libexec / "hooks.env").write_text(f"JOBSIGHT_BIN={_stub_jobsight(tmp_path)}\nJOBSIGHT_CLUSTER=beside\n")
    seen = _wrapper_env_seen(tmp_path, installed)
    assert seen.get("ARGS") == f"slurm {WRAPPERS[wrapper]}"
    assert (seen["JOBSIGHT_CLUSTER"], seen["SLURM_CONF"]) == ("beside", "/opt/slurm-26.05/etc/slurm.conf")


@pytest.mark.skipif(os.geteuid() != 0, reason="the wrappers read only root's files: the test writes them as root")
@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_the_hooks_env_beside_a_wrapper_wins_and_is_read_only_when_roots_alone(tmp_path: Path, wrapper: str) -> None:
    """Both files: the system one (here moved into the test's directory in a copy of the wrapper) first,
    the one beside the wrapper over it. One that group or others can write, another user's, or one
    that does not parse is not read."""
    system = tmp_path / "etc" / "hooks.env"
    system.parent.mkdir()
    system.write_text(f"JOBSIGHT_BIN={_stub_jobsight(tmp_path)}\nJOBSIGHT_CLUSTER=system\nJOBSIGHT_URL=http://etc:1\n")
    libexec = tmp_path / "libexec"
    libexec.mkdir()
    installed = libexec / wrapper
    text = (REPO / "slurm" / wrapper).read_text()
    line = "\nSYSTEM_HOOKS_ENV=/etc/jobsight/hooks.env\n"
    assert text.count(line) == 1
    installed.write_text(text.replace(line, f"\nSYSTEM_HOOKS_ENV={system}\n"))
    installed.chmod(0o755)
    beside = libexec / "hooks.env"
    beside.write_text("JOBSIGHT_CLUSTER=beside\n")
    seen = _wrapper_env_seen(tmp_path, installed)
    assert (seen["JOBSIGHT_CLUSTER"], seen["JOBSIGHT_URL"]) == ("beside", "http://etc:1")
    beside.chmod(0o664)
    assert _wrapper_env_seen(tmp_path, installed)["JOBSIGHT_CLUSTER"] == "system"
    beside.chmod(0o644)
    os.chown(beside, 65534, 65534)
    assert _wrapper_env_seen(tmp_path, installed)["JOBSIGHT_CLUSTER"] == "system"
    os.chown(beside, 0, 0)
    beside.write_text("JOBSIGHT_CLUSTER=beside\nif then\n")
    assert _wrapper_env_seen(tmp_path, installed)["JOBSIGHT_CLUSTER"] == "system"
    # Nothing else in the wrapper's directory: the system file alone, as before.
    beside.unlink()
    assert _wrapper_env_seen(tmp_path, installed)["JOBSIGHT_CLUSTER"] == "system"
