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

    result, took = run_hook("prolog", {**env, **slurm_env(job, "prolog")})
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

    row = db.execute("SELECT user_name, uid, account, partition, nodes, gpus, node_count, time_limit_s, state, name "
                     "FROM jobs WHERE job_id = %s", (job,)).fetchone()
    assert row == ("nobody", job_uid(), "acct1", "gpu", ["vm"], ["vm:0", "vm:1"], 1, 1800, "running", "my job")

    # The task prolog runs as the job's user with the job's environment: one export per line.
    task_env = {**env, **slurm_env(job, "prolog_task"), "SLURM_JOB_NAME": "train"}
    result, _ = run_hook("task-prolog", task_env)
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    # No node daemon says it serves PyTorch's profiler here: nothing points the job at a socket.
    assert lines == [f"export JOBSIGHT_URL={collector.url}", "export JOBSIGHT_CLUSTER=default",
                     f"export JOBSIGHT_JOB_ID={job}", f"export JOBSIGHT_TOKEN={token_file.read_text().strip()}"]
    token = lines[-1].split("=", 1)[1]
    # While the daemon's (root's) status says, freshly, that it serves: KINETO_USE_DAEMON and the
    # user's own socket directory, unless the site turns it off or the job set it itself.
    status = Path(env["JOBSIGHT_REGISTRATION_DIR"]).parent / "agent-status.json"
    status.write_text(json.dumps({"kineto": {"serving": True}, "updated_at": time.time()}))
    result, _ = run_hook("task-prolog", task_env)
    assert result.stdout.splitlines()[3:6] == [
        "export KINETO_USE_DAEMON=1", f"export KINETO_IPC_SOCKET_DIR=/run/jobsight/kineto/{os.getuid()}",
        f"export KINETO_ONDEMAND_TRACE_DIR=/var/lib/jobsight/traces/{job}"]
    result, _ = run_hook("task-prolog", {**task_env, "JOBSIGHT_KINETO_DAEMON": "0"})
    assert "export KINETO_USE_DAEMON=1" not in result.stdout.splitlines()
    result, _ = run_hook("task-prolog", {**task_env, "KINETO_USE_DAEMON": "0"})
    assert "export KINETO_USE_DAEMON=1" not in result.stdout.splitlines()
    log = {"kind": "log", "job": job, "ts": now_us(), "level": "INFO", "message": "from the job"}
    assert ingest(collector.url, token, [log]) == 200
    assert ingest(collector.url, token, [{**log, "job": new_job()}]) == 403

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
    assert missing.stderr.strip() == "jobsight report: job no-such-job not found in cluster default"
    away = subprocess.run([sys.executable, "-m", "jobsight", "report", job], env={**env, "JOBSIGHT_URL":
                          "http://127.0.0.1:1"}, cwd=REPO, text=True, capture_output=True, timeout=30)
    assert away.returncode == 1 and len(away.stderr.strip().splitlines()) == 1
    assert "cannot reach the collector at http://127.0.0.1:1" in away.stderr
