"""The node's energy beside its GPUs on a real Slurm's real cgroups (issue #41).

The test cluster as it is configured (tests/slurm/cgroup.conf.in: cgroup v1, memory constrained only;
``jobacct_gather/none``): a job's cgroup counts no CPU time, so the node daemon sums its processes'. Two
real ``--gres=gpu:1`` jobs, registered by the hooks, run side by side: one burns a core until it has used
:data:`BURN_CPU_S` CPU-seconds, the other sleeps until cancelled. The node daemon (``jobsight agent`` on
the fake NVML, ``JOBSIGHT_POWER_SOURCE=rapl``) reads a RAPL tree in the kernel's layout under a test root,
whose package and DRAM counters a thread of the test advances at a known constant power, the real
``/proc/stat`` and the jobs' real cgroups and processes, and ships to a collector of this module on a
database of its own. The burning job gets its CPU time and most of the tree's energy, the sleeping one
next to none, together no more than the tree counted, and ``jobsight report`` names RAPL.

Needs root and the test cluster (``bash tests/slurm/setup_cluster.sh``); skips otherwise, fails instead
with ``JOBSIGHT_REQUIRE_SLURM=1`` (CI). ``/etc/jobsight/hooks.env`` points at this module's collector and
is put back (``JOBSIGHT_BIN`` only) at the end, as in tests/slurm/test_e2e.py.
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobsight.collector.store import migrate
from jobsight.rules.energy_text import ENERGY_SPLITS, POWER_SOURCES
from tests.agent.node.power.test_node_energy import RANGE_UJ, zone
from tests.conftest import REPO, LiveCollector, create_database
from tests.slurm.slurm_commands import SBATCH, SCANCEL, busy_queue
from tests.slurm.test_e2e import FINAL_STATES, SLURM_BINARIES, _free_port, _setup_cluster, _unavailable, job_state

pytestmark = pytest.mark.slurm

WORK = Path("/var/tmp/jobsight-node-energy")
REGISTRATIONS = Path("/run/jobsight/jobs")
PACKAGE_W, DRAM_W = 40.0, 10.0
"""The fake tree's constant power: package 0 and its DRAM."""
BURN_CPU_S = 12.0
"""CPU-seconds the burning job uses before it ends: counted in CPU time, not wall time, so a machine
busy with other work makes it longer, never leaves it with less to show."""
BURN = ("import time\nwhile time.process_time() < " + str(BURN_CPU_S) + ":\n    pass\n")
WAIT_S = 240.0
DAEMON_INTERVAL_S = 0.5


class FakeRapl:
    """A RAPL tree (``intel-rapl:0`` package-0 and ``intel-rapl:0:1`` its DRAM) whose counters a thread
    advances at :data:`PACKAGE_W` and :data:`DRAM_W`, from the time it really passed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.package = root / "intel-rapl:0"
        self.dram = root / "intel-rapl:0:1"
        zone(root, "intel-rapl:0", "package-0", 1_000_000)
        zone(root, "intel-rapl:0:1", "dram", 2_000_000)
        zone(root, "intel-rapl:0:0", "core", 5)  # inside the package: must not be counted
        self.start_uj = self._read(self.package) + self._read(self.dram)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-rapl", daemon=True)

    @staticmethod
    def _read(zone_dir: Path) -> int:
        return int((zone_dir / "energy_uj").read_text())

    @staticmethod
    def _write(zone_dir: Path, value: int) -> None:
        # Replaced whole: the daemon never reads a half-written counter.
        tmp = zone_dir / "energy_uj.tmp"
        tmp.write_text(f"{value % RANGE_UJ}\n")
        os.replace(tmp, zone_dir / "energy_uj")

    def _run(self) -> None:
        last = time.monotonic()
        package, dram = self._read(self.package), self._read(self.dram)
        while not self._stop.wait(0.1):
            now = time.monotonic()
            package += round(PACKAGE_W * (now - last) * 1e6)
            dram += round(DRAM_W * (now - last) * 1e6)
            last = now
            self._write(self.package, package)
            self._write(self.dram, dram)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> float:
        """Stop advancing; the joules the tree counted since it was made."""
        self._stop.set()
        self._thread.join(timeout=10)
        return (self._read(self.package) + self._read(self.dram) - self.start_uj) / 1e6


@dataclass
class NodeEnergyRun:
    collector: LiveCollector
    database_url: str
    admin_token: str
    jobs: dict[str, str]
    """``burn`` and ``idle`` → Slurm job id."""
    tree_j: float
    """Joules the fake RAPL tree counted over the whole run (the daemon's ticks lie within it)."""

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()


def _wait(what: str, check: Callable[[], bool], diagnostics: Callable[[], str]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {WAIT_S:.0f} s\n{diagnostics()}")
        time.sleep(0.5)


def _diagnostics(jobs: dict[str, str]) -> str:
    parts = [f"jobs: { {what: (job, job_state(job)) for what, job in jobs.items()} }"]
    for path in (WORK / "hooks.log", WORK / "daemon.log", WORK / "collector.log"):
        try:
            parts.append(f"--- {path} (tail)\n" + path.read_text(errors="replace")[-3000:])
        except OSError:
            pass
    return "\n".join(parts)


def _submit(name: str, command: str) -> str:
    result = subprocess.run(
        [SBATCH, "--parsable", "--gres=gpu:1", "-c", "1", "--mem", "256M", "-t", "5", "-J", f"energy-{name}",
         "-o", str(WORK / "out" / f"{name}-%j.out"), "-D", str(WORK / "out"), "--wrap", f"exec {command}"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(WORK / "out"), "LANG": "C.UTF-8"},
        capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def _ended(job: str) -> bool:
    return job_state(job)[0].split("+")[0] in FINAL_STATES


def _stop(process: subprocess.Popen[bytes] | None) -> None:
    if process is not None and process.poll() is None:
        process.terminate()  # the daemon ships what it holds on SIGTERM
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


@pytest.fixture(scope="module")
def run(postgres: Any, data_dir: Path, admin_token: str) -> Iterator[NodeEnergyRun]:
    """Both jobs run to their end under the daemon on RAPL; the daemon stopped, its samples stored."""
    missing = [b for b in (*SLURM_BINARIES, SCANCEL) if not os.access(b, os.X_OK)]
    if os.geteuid() != 0 or missing:
        _unavailable("the node-energy real-Slurm test needs root and " + ", ".join(missing or ["Slurm"])
                     + "; run `bash tests/slurm/setup_cluster.sh` as root first")
    try:
        import pynvml  # noqa: F401

        from tests.fake_nvml.build import SCENARIOS, GccMissing, build_fake_nvml

        library = build_fake_nvml()
    except (ImportError, GccMissing) as exc:
        _unavailable(f"the node daemon needs pynvml and the fake NVML: {exc}")
    if queue := busy_queue():
        _unavailable(f"other jobs are in the Slurm queue; this test needs the test cluster to itself:\n{queue}")

    shutil.rmtree(WORK, ignore_errors=True)
    for sub in ("spool", "daemon", "out"):
        (WORK / sub).mkdir(parents=True, mode=0o755)
    WORK.chmod(0o755)
    secret_file = WORK / "cluster_secret"
    secret_file.write_text(uuid.uuid4().hex * 2 + "\n")
    secret_file.chmod(0o600)
    for stale in REGISTRATIONS.glob("*.json"):  # an interrupted run's registrations would claim the GPUs
        stale.unlink()

    database_url = create_database(postgres, f"node_energy_{uuid.uuid4().hex[:12]}")
    migrate.upgrade(database_url)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    shared = {"JOBSIGHT_URL": url, "JOBSIGHT_SECRET_FILE": str(secret_file),
              "JOBSIGHT_SPOOL_DIR": str(WORK / "spool"), "JOBSIGHT_NODE": socket.gethostname().split(".")[0]}
    _setup_cluster({**shared, "JOBSIGHT_HOOK_LOG": str(WORK / "hooks.log")})
    collector = LiveCollector(database_url, data_dir, admin_token, WORK / "collector.log",
                              env={"JOBSIGHT_SECRET_FILE": str(secret_file),
                                   "JOBSIGHT_SUMMARY_REFRESH_INTERVAL_S": "2"})
    collector.port, collector.url = port, url
    rapl = FakeRapl(WORK / "powercap")
    daemon_env = {**os.environ, **shared, "JOBSIGHT_DATA_DIR": str(WORK / "daemon"),
                  "JOBSIGHT_NVML_LIBRARY": str(library), "FAKE_NVML_SCENARIO": str(SCENARIOS / "four_gpus.json"),
                  "JOBSIGHT_BATCH_AGE_S": "0.5", "JOBSIGHT_POWER_SOURCE": "rapl",
                  "JOBSIGHT_POWERCAP_ROOT": str(rapl.root)}
    for name in ("JOBSIGHT_TOKEN", "JOBSIGHT_TOKEN_FILE", "JOBSIGHT_JOB_ID", "JOBSIGHT_REGISTRATION_DIR"):
        daemon_env.pop(name, None)
    jobs: dict[str, str] = {}
    daemon: subprocess.Popen[bytes] | None = None
    tree_j: float | None = None
    try:
        collector.start()
        rapl.start()
        with open(WORK / "daemon.log", "ab") as log:
            daemon = subprocess.Popen([sys.executable, "-m", "jobsight", "agent", "--interval",
                                       str(DAEMON_INTERVAL_S)], env=daemon_env, cwd=REPO, stdout=log,
                                      stderr=subprocess.STDOUT)
        jobs["idle"] = _submit("idle", "/bin/sleep 300")
        jobs["burn"] = _submit("burn", f"{sys.executable} -c '{BURN}'")
        diagnostics = functools.partial(_diagnostics, jobs)
        _wait("the burning job ended", lambda: _ended(jobs["burn"]), diagnostics)
        assert job_state(jobs["burn"]) == ("COMPLETED", "0:0"), diagnostics()
        subprocess.run([SCANCEL, jobs["idle"]], capture_output=True, timeout=10)
        _wait("the idle job ended", lambda: _ended(jobs["idle"]), diagnostics)
        # Its epilog removed each registration: the daemon samples neither any more.
        _wait("both registrations gone", lambda: not any(REGISTRATIONS.glob("*.json")), diagnostics)
        _stop(daemon)
        tree_j = rapl.stop()
        yield NodeEnergyRun(collector, database_url, admin_token, jobs, tree_j)
    finally:
        for job in jobs.values():
            subprocess.run([SCANCEL, job], capture_output=True, timeout=10)
        # Out of the queue (epilogs run) before the collector goes and the next Slurm module starts.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(_ended(job) for job in jobs.values()):
            time.sleep(0.3)
        _stop(daemon)
        if tree_j is None:
            rapl.stop()
        collector.kill()
        _setup_cluster({})  # hooks.env back to JOBSIGHT_BIN only


def test_a_burning_job_gets_its_cpu_time_and_its_share_of_a_rapl_trees_energy(run: NodeEnergyRun) -> None:
    """On cgroup v1 with memory constrained only, the burning job's host samples carry its processes'
    CPU time (its cgroup counts none) and its share of RAPL's joules by it; the sleeping job's next to
    none; together no more than the tree counted; the report names RAPL and the split."""
    burn, idle = run.jobs["burn"], run.jobs["idle"]
    diagnostics = functools.partial(_diagnostics, run.jobs)
    rows = {job: run.query("SELECT max(cpu_time_s), sum(energy_j), count(energy_j), "
                           "array_remove(array_agg(DISTINCT power_source), NULL), "
                           "array_remove(array_agg(DISTINCT energy_split), NULL) "
                           "FROM host_samples WHERE job_id = %s AND cluster = 'default'", job)[0]
            for job in (burn, idle)}
    (burn_cpu, burn_j, burn_n, burn_sources, burn_splits) = rows[burn]
    (idle_cpu, idle_j, idle_n, idle_sources, _) = rows[idle]
    figures = f"burn {rows[burn]}, idle {rows[idle]}, tree {run.tree_j:.1f} J\n"
    print(figures)
    assert burn_n > 0 and idle_n > 0, figures + diagnostics()
    assert burn_cpu is not None and burn_cpu > BURN_CPU_S / 2, figures
    assert idle_cpu is not None and idle_cpu < 1.0, figures
    assert burn_sources == idle_sources == ["rapl"] and burn_splits == ["cpu_time+idle_cores"], figures
    # The burning job used a core of the node's two while it ran: a clear share; the sleeping one next
    # to none (its cgroup gives no cores, so no idle part either).
    assert burn_j > 0.05 * run.tree_j and burn_j > 10 * idle_j, figures
    assert burn_j + idle_j <= run.tree_j * (1 + 1e-9), figures

    env = {**os.environ, "JOBSIGHT_URL": run.collector.url, "JOBSIGHT_TOKEN": run.admin_token}
    for job in (burn, idle):
        report = subprocess.run([sys.executable, "-m", "jobsight", "report", job], env=env, cwd=REPO,
                                capture_output=True, text=True, timeout=30)
        assert report.returncode == 0, report.stderr
        node_line = next((line for line in report.stdout.splitlines() if "Node energy" in line), "")
        assert POWER_SOURCES["rapl"] in node_line and ENERGY_SPLITS["cpu_time+idle_cores"] in node_line, \
            report.stdout
        print(report.stdout)
