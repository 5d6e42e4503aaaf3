"""``jobsight agent`` as a real process over the fake libnvidia-ml.so.1, shipping to a real
collector; and the in-process sampler of a training process.

Job processes are real children started with ``SLURM_JOB_ID`` in their environment,
which names no job (only registrations and Slurm's cgroups do); the scenario file is
written at test time with their pids (``gpus[i].processes[].pid``), so the daemon
looks them up through the real ``/proc``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobsight.agent.node.registrations import Registration, write_registration
from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.shipper import Shipper
from jobsight.agent.training.context import RunContext
from jobsight.agent.training.gpu_sampler import start_inprocess_sampler
from jobsight.protocol.wire import now_us

REPO = Path(__file__).resolve().parents[3]
FAKE_DIR = REPO / "tests" / "fake_nvml"
GiB = 1024**3

Spawn = Callable[[str], int]


@pytest.fixture
def job_process() -> Iterator[Spawn]:
    """Start a real process of a Slurm job (``SLURM_JOB_ID`` set); returns its pid."""
    started: list[subprocess.Popen[bytes]] = []

    def spawn(job: str) -> int:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_JOB_ID"] = job
        process = subprocess.Popen(["sleep", "60"], env=env)
        started.append(process)
        return process.pid

    yield spawn
    for process in started:
        process.kill()
        process.wait()


def write_scenario(path: Path, processes: dict[int, list[int]]) -> Path:
    """four_gpus.json with the given pids running on the given GPU indices."""
    scenario = json.loads((FAKE_DIR / "scenarios" / "four_gpus.json").read_text())
    for index, gpu in enumerate(scenario["gpus"]):
        gpu["processes"] = [{"pid": pid, "used_memory": GiB} for pid in processes.get(index, [])]
    path.write_text(json.dumps(scenario))
    return path


def register(directory: Path, job: str, gpus: list[int], node: str) -> None:
    write_registration(
        directory,
        Registration(cluster="default", job_id=job, node=node, started_us=now_us(), gpus=tuple(gpus), user="ana"),
    )


def daemon_env(tmp_path: Path, collector: Any, library: Path | str, scenario: Path, node: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "JOBSIGHT_"))}
    env.update(
        {
            "JOBSIGHT_URL": collector.url,
            "JOBSIGHT_TOKEN": collector.token,
            "JOBSIGHT_NODE": node,
            "JOBSIGHT_REGISTRATION_DIR": str(tmp_path / "jobs"),
            "JOBSIGHT_NVML_LIBRARY": str(library),
            "JOBSIGHT_SPOOL_DIR": str(tmp_path / "spool"),
            "JOBSIGHT_DATA_DIR": str(tmp_path / "data"),
            "JOBSIGHT_BATCH_AGE_S": "0.2",
            "JOBSIGHT_SECRET_FILE": str(tmp_path / "no-secret"),
            "FAKE_NVML_SCENARIO": str(scenario),
        }
    )
    return env


def agent_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "jobsight", "agent", *args]


def gpu_rows(db: psycopg.Connection[Any], node: str) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT job_id, gpu_index, gpu_uuid, util_gpu, power_w, mem_used, temp_c FROM gpu_samples"
        " WHERE node = %s ORDER BY ts, gpu_index",
        (node,),
    ).fetchall()


def expected_gpu(index: int, row: tuple[Any, ...]) -> None:
    _, gpu_index, uuid, util, power, mem_used, temp = row
    assert gpu_index == index
    assert uuid == f"GPU-{index}0000000-aaaa-bbbb-cccc-00000000000{index}"
    assert util in ({11.0, 22.0, 33.0} if index == 1 else {10.0 * (index + 1)})
    assert power == pytest.approx(100.1 + 50 * index)  # 100123 mW to 0.1 W
    assert mem_used == (index + 1) * 10 * GiB
    assert temp == 40.0 + index


def test_two_registered_jobs_on_disjoint_gpus_then_sigterm(
    live_collector: Any, db: psycopg.Connection[Any], fake_library: Path, tmp_path: Path, job_process: Spawn
) -> None:
    node = f"node-{tmp_path.name}"
    job_a, job_b = f"{tmp_path.name}-a", f"{tmp_path.name}-b"
    pid_a, pid_b = job_process(job_a), job_process(job_b)
    scenario = write_scenario(tmp_path / "scenario.json", {0: [pid_a], 2: [pid_b]})
    register(tmp_path / "jobs", job_a, [0, 1], node)
    register(tmp_path / "jobs", job_b, [2, 3], node)
    env = daemon_env(tmp_path, live_collector, fake_library, scenario, node)
    daemon = subprocess.Popen(
        agent_command("--interval", "0.5"), env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 20
        while len(gpu_rows(db, node)) < 12 and time.monotonic() < deadline:  # three ticks of four GPUs
            assert daemon.poll() is None, daemon.communicate()[1].decode()
            time.sleep(0.2)
        daemon.send_signal(signal.SIGTERM)
        _, stderr = daemon.communicate(timeout=15)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert daemon.returncode == 0, stderr.decode()
    assert b"Traceback" not in stderr

    rows = gpu_rows(db, node)
    assert len(rows) >= 12
    by_job: dict[str, list[tuple[Any, ...]]] = {}
    for row in rows:
        by_job.setdefault(row[0], []).append(row)
    assert set(by_job) == {job_a, job_b}
    assert {r[1] for r in by_job[job_a]} == {0, 1}
    assert {r[1] for r in by_job[job_b]} == {2, 3}
    for row in rows:
        expected_gpu(row[1], row)
    # One snapshot per tick: every GPU appears equally often.
    counts = [sum(1 for r in rows if r[1] == i) for i in range(4)]
    assert len(set(counts)) == 1, counts

    # The jobs' processes are the test's children: SLURM_JOB_ID is in their environment only, and no
    # Slurm cgroup holds them, so no host sample claims them (the host samples' own tests: test_host.py).
    host = db.execute("SELECT job_id FROM host_samples WHERE node = %s", (node,)).fetchall()
    assert host == []


@pytest.fixture
def secret_collector(database_url: str, data_dir: Path, admin_token: str, tmp_path: Path,
                     monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Path]]:
    """A real collector with a cluster secret (so node tokens count), and the secret's file."""
    from tests.conftest import LiveCollector

    secret = tmp_path / "cluster_secret"
    secret.write_text("s3cret-for-this-test\n")
    secret.chmod(0o600)
    monkeypatch.setenv("JOBSIGHT_SECRET_FILE", str(secret))
    collector = LiveCollector(database_url, data_dir, admin_token, tmp_path / "collector.log")
    collector.start()
    yield collector, secret
    collector.kill()


def unallocated_rows(db: psycopg.Connection[Any], node: str) -> list[tuple[Any, ...]]:
    return db.execute("SELECT gpu_index, gpu_uuid, pid, uid, mem_used FROM gpu_unallocated_uses WHERE node = %s"
                      " ORDER BY gpu_index, pid", (node,)).fetchall()


def test_a_process_claiming_a_job_on_a_gpu_no_job_was_given_is_reported_never_shipped_as_that_job(
    secret_collector: tuple[Any, Path], db: psycopg.Connection[Any], fake_library: Path, tmp_path: Path,
    job_process: Spawn,
) -> None:
    """Outside any job, one process names the registered victim's job in ``SLURM_JOB_ID`` (GPU 3), another
    ``--user=alice`` (GPU 2): neither GPU is shipped under any job, the victim's job sees only its own GPUs,
    and both uses reach the collector, through the node's own token, as uses outside any job."""
    collector, secret = secret_collector
    node = f"node-{tmp_path.name}"
    victim = f"{tmp_path.name}-victim"
    pid_victim, pid_forger, pid_option = job_process(victim), job_process(victim), job_process("--user=alice")
    scenario = write_scenario(tmp_path / "scenario.json", {0: [pid_victim], 3: [pid_forger], 2: [pid_option]})
    register(tmp_path / "jobs", victim, [0, 1], node)
    env = daemon_env(tmp_path, collector, fake_library, scenario, node)
    del env["JOBSIGHT_TOKEN"]  # the daemon mints its node token from the cluster secret
    env["JOBSIGHT_SECRET_FILE"] = str(secret)
    done = subprocess.run(agent_command("--once"), env=env, cwd=REPO, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr.decode()

    assert sorted((r[0], r[1]) for r in gpu_rows(db, node)) == [(victim, 0), (victim, 1)]
    assert db.execute("SELECT count(*) FROM jobs WHERE job_id IN ('--user=alice') OR nodes @> ARRAY[%s]"
                      " AND job_id <> %s", (node, victim)).fetchone()[0] == 0
    assert unallocated_rows(db, node) == [
        (2, "GPU-20000000-aaaa-bbbb-cccc-000000000002", pid_option, os.getuid(), GiB),
        (3, "GPU-30000000-aaaa-bbbb-cccc-000000000003", pid_forger, os.getuid(), GiB),
    ]
    assert "outside any job" in done.stderr.decode()


def test_a_gpu_used_outside_any_job_is_reported_once_a_minute_while_the_use_lasts(
    live_collector: Any, db: psycopg.Connection[Any], fake_library: Path, tmp_path: Path, job_process: Spawn,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jobsight.agent.node.daemon import NodeDaemon
    from jobsight.agent.node.gpu.sampler import NvmlSampler

    node = f"node-{tmp_path.name}"
    pid = job_process("4242")
    busy, idle = write_scenario(tmp_path / "busy.json", {1: [pid]}), write_scenario(tmp_path / "idle.json", {})
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(busy))
    settings = AgentSettings(url=live_collector.url, token=live_collector.token, node=node,
                             spool_dir=str(tmp_path / "spool"), data_dir=str(tmp_path / "data"), batch_age_s=0.1,
                             registration_dir=str(tmp_path / "jobs"), nvml_library=str(fake_library))
    clock = [1000.0]
    shipper = Shipper(settings)
    daemon = NodeDaemon(settings, NvmlSampler(str(fake_library)), shipper, clock=lambda: clock[0])

    def ticks(*at: float) -> list[int]:
        queued = []
        for seconds in at:
            clock[0] = 1000.0 + seconds
            queued.append(daemon.tick().unallocated_records)
        return queued

    def use(scenario: Path) -> None:  # NVML reads its scenario when it starts
        daemon.sampler.close()
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(scenario))
        daemon.sampler = NvmlSampler(str(fake_library))

    try:
        assert ticks(0, 30, 59.5, 60, 61, 90) == [1, 0, 0, 1, 0, 0]
        use(idle)
        assert ticks(100) == [0]  # the use ended: forgotten
        use(busy)
        assert ticks(101, 102) == [1, 0]  # a new use is reported at once
        assert shipper.flush(10)
    finally:
        daemon.sampler.close()
        shipper.shutdown(2)
    assert [r[:3] for r in unallocated_rows(db, node)] == [(1, "GPU-10000000-aaaa-bbbb-cccc-000000000001", pid)] * 3
    assert db.execute("SELECT count(*) FROM gpu_samples WHERE node = %s", (node,)).fetchone()[0] == 0


def test_daemon_ships_with_a_node_token_minted_from_the_cluster_secret(
    database_url: str,
    data_dir: Path,
    admin_token: str,
    db: psycopg.Connection[Any],
    fake_library: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.conftest import LiveCollector

    secret = tmp_path / "cluster_secret"
    secret.write_text("s3cret-for-this-test\n")
    secret.chmod(0o600)
    monkeypatch.setenv("JOBSIGHT_SECRET_FILE", str(secret))
    collector = LiveCollector(database_url, data_dir, admin_token, tmp_path / "collector.log")
    collector.start()
    try:
        node = f"node-{tmp_path.name}"
        job = f"{tmp_path.name}-a"
        register(tmp_path / "jobs", job, [1], node)
        scenario = write_scenario(tmp_path / "scenario.json", {})
        env = daemon_env(tmp_path, collector, fake_library, scenario, node)
        del env["JOBSIGHT_TOKEN"]
        env["JOBSIGHT_SECRET_FILE"] = str(secret)
        done = subprocess.run(agent_command("--once"), env=env, cwd=REPO, capture_output=True, timeout=30)
        assert done.returncode == 0, done.stderr.decode()
    finally:
        collector.kill()
    assert [(r[0], r[1]) for r in gpu_rows(db, node)] == [(job, 1)]


def test_missing_nvml_library_is_one_line_and_exit_3(tmp_path: Path, fake_library: Path) -> None:
    collector = type("Nowhere", (), {"url": "http://127.0.0.1:9", "token": "x"})()
    env = daemon_env(tmp_path, collector, tmp_path / "no" / "libnvidia-ml.so.1", tmp_path / "none.json", "n1")
    done = subprocess.run(agent_command("--once"), env=env, cwd=REPO, capture_output=True, timeout=30, text=True)
    assert done.returncode == 3
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "NVML library" in lines[0], done.stderr


@pytest.mark.parametrize("value", ["abc", "0.1", "nan"])
def test_bad_interval_names_the_flag(value: str, tmp_path: Path, fake_library: Path) -> None:
    collector = type("Nowhere", (), {"url": "http://127.0.0.1:9", "token": "x"})()
    env = daemon_env(tmp_path, collector, fake_library, tmp_path / "none.json", "n1")
    done = subprocess.run(
        agent_command("--interval", value, "--once"), env=env, cwd=REPO, capture_output=True, timeout=30, text=True
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--interval" in lines[0] and "Traceback" not in done.stderr, done.stderr


# -- in-process sampling ------------------------------------------------------------


def _inprocess_settings(collector: Any, tmp_path: Path, library: Path | str) -> AgentSettings:
    return AgentSettings(
        url=collector.url,
        token=collector.token,
        node=f"node-{tmp_path.name}",
        spool_dir=str(tmp_path / "spool"),
        data_dir=str(tmp_path / "data"),
        batch_age_s=0.1,
        sample_interval_s=0.5,
        registration_dir=str(tmp_path / "jobs"),
        nvml_library=str(library),
    )


def test_inprocess_sampler_ships_only_visible_gpus(
    live_collector: Any,
    db: psycopg.Connection[Any],
    fake_library: Path,
    tmp_path: Path,
    job_id: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(FAKE_DIR / "scenarios" / "four_gpus.json"))
    settings = _inprocess_settings(live_collector, tmp_path, fake_library)
    shipper = Shipper(settings)
    context = RunContext(job=job_id, node=settings.node, rank=0, local_rank=0, cluster="default")
    sampler = start_inprocess_sampler(settings, context, shipper=shipper, environ={"CUDA_VISIBLE_DEVICES": "1,2"})
    assert sampler is not None
    try:
        assert sampler.gpu_indices == [1, 2]
        assert start_inprocess_sampler(settings, context, shipper=shipper) is sampler  # one per process
        deadline = time.monotonic() + 10
        while sampler.ticks < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        sampler.stop()
    assert not sampler.running
    assert shipper.flush(10)
    shipper.shutdown(2)
    rows = db.execute(
        "SELECT gpu_index, util_gpu, node FROM gpu_samples WHERE job_id = %s ORDER BY ts, gpu_index", (job_id,)
    ).fetchall()
    assert len(rows) >= 6
    assert {r[0] for r in rows} == {1, 2}
    assert {r[2] for r in rows} == {settings.node}
    assert {r[1] for r in rows if r[0] == 2} == {30.0}


def test_inprocess_sampler_stands_aside(
    fake_library: Path, tmp_path: Path, job_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(FAKE_DIR / "scenarios" / "four_gpus.json"))
    nowhere = type("Nowhere", (), {"url": "http://127.0.0.1:9", "token": "x"})()  # nothing is shipped here
    settings = _inprocess_settings(nowhere, tmp_path, fake_library)
    shipper = Shipper(settings, use_spool=False)
    try:
        rank1 = RunContext(job=job_id, node="n", rank=1, local_rank=1, cluster="default")
        assert start_inprocess_sampler(settings, rank1, shipper=shipper) is None
        rank0 = RunContext(job=job_id, node="n", rank=0, local_rank=0, cluster="default")
        assert start_inprocess_sampler(settings, rank0, shipper=shipper, environ={"CUDA_VISIBLE_DEVICES": ""}) is None
        missing = _inprocess_settings(nowhere, tmp_path, tmp_path / "absent.so")
        assert start_inprocess_sampler(missing, rank0, shipper=shipper) is None  # NVML absent: no raise
        register(tmp_path / "jobs", job_id, [0], "n")  # a node daemon serves the job
        assert start_inprocess_sampler(settings, rank0, shipper=shipper) is None
    finally:
        shipper.shutdown(1)
