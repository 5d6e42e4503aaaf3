"""A throwaway embedded PostgreSQL + collector process for benchmarks."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobsight.collector.store import migrate
from jobsight.collector.store.embedded_db import EmbeddedPostgres, free_port

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Stack:
    database_url: str
    url: str
    token: str
    work: Path
    """A scratch folder (0755) that is removed with the stack."""
    secret_file: Path
    """The cluster secret the collector was started with (for job and node tokens)."""
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    postgres_data: Path | None = None
    """The embedded server's data directory (its ``postmaster.pid`` names the server's process)."""
    more_postgres_data: list[Path] = field(default_factory=list)
    """Other servers of the database (a Citus cluster's workers)."""

    def postgres_pid(self) -> int | None:
        """The postmaster's pid (its backends are its children), ``None`` when not running."""
        pids = self.postgres_pids()
        return pids[0] if pids else None

    def postgres_pids(self) -> list[int]:
        """Every server's postmaster pid: the database's, then a Citus cluster's workers'."""
        pids = []
        datas = [self.postgres_data] if self.postgres_data is not None else []
        for data in [*datas, *self.more_postgres_data]:
            try:
                pids.append(int((data / "postmaster.pid").read_text().split()[0]))
            except (OSError, ValueError, IndexError):
                continue
        return pids

    def stop_collector(self) -> None:
        """Stop the collector, leaving the database up (to time what runs while it is away)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        self.process = None


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"collector did not start: {log.read_text()[-2000:]}") from None
            time.sleep(0.2)


def _database(work: Path, kind: str) -> tuple[str, list[EmbeddedPostgres]]:
    """The migrated database the stack writes to, and its servers (the first one's URL).

    ``embedded``: the wheel's PostgreSQL. ``pg15``: Debian's PostgreSQL 15 alone, and ``citus``: a
    coordinator and two workers of it with Citus (tests/citus/cluster.py), distributed as
    ``jobsight migrate --citus`` does; these two compare like with like."""
    if kind == "embedded":
        server = EmbeddedPostgres(work / "postgres")
        url = server.start()
        migrate.upgrade(url)
        return url, [server]
    from jobsight.collector.store.citus import distribute
    from tests.citus.cluster import citus_missing, start_citus_cluster, start_single_server

    if kind == "pg15":
        single = start_single_server(work)
        migrate.upgrade(single.url)
        return single.url, [single]
    why = citus_missing()
    if why is not None:
        raise SystemExit(f"--citus: {why}")
    cluster = start_citus_cluster(work)
    migrate.upgrade(cluster.url)
    distribute(cluster.url)
    return cluster.url, [cluster.coordinator, *cluster.workers]


@contextmanager
def running_stack(workers: int = 1, database: str = "embedded") -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="jobsight-bench-") as tmp:
        work = Path(tmp)
        os.chmod(work, 0o755)  # the embedded server runs as its own user when we are root
        database_url, servers = _database(work, database)
        server = servers[0]
        secret = work / "cluster_secret"
        secret.write_text(os.urandom(32).hex() + "\n")
        secret.chmod(0o600)
        port = free_port()
        env = {**os.environ, "JOBSIGHT_DATABASE_URL": database_url, "JOBSIGHT_DATA_DIR": str(work / "data"),
               "JOBSIGHT_PORT": str(port), "JOBSIGHT_SECRET_FILE": str(secret),
               # Compaction passes are the bench's to start (bench/cluster.py --pack), at a known moment.
               "JOBSIGHT_COMPACT_INTERVAL_S": "0"}
        log = work / "collector.log"
        with open(log, "ab") as out:
            process = subprocess.Popen([sys.executable, "-m", "jobsight", "collector", "--workers", str(workers)],
                                       env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        stack = Stack(database_url, url, "", work, secret, process, postgres_data=server.data_dir,
                      more_postgres_data=[s.data_dir for s in servers[1:]])
        try:
            _wait_ready(url, process, log)
            stack.token = (work / "data" / "admin_token").read_text().strip()
            yield stack
        finally:
            stack.stop_collector()
            for each in servers:
                each.destroy()


def median_time(fn: Callable[[], Any], repeat: int) -> float:
    """Median wall time of ``repeat`` runs after one warm-up, in seconds."""
    fn()
    runs = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - began)
    return statistics.median(runs)
