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

from jobsight.collector import migrate
from jobsight.collector.embedded_db import EmbeddedPostgres, free_port

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

    def postgres_pid(self) -> int | None:
        """The postmaster's pid (its backends are its children), ``None`` when not running."""
        if self.postgres_data is None:
            return None
        try:
            return int((self.postgres_data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

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


@contextmanager
def running_stack(workers: int = 1) -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="jobsight-bench-") as tmp:
        work = Path(tmp)
        os.chmod(work, 0o755)  # the embedded server runs as its own user when we are root
        server = EmbeddedPostgres(work / "postgres")
        database_url = server.start()
        migrate.upgrade(database_url)
        secret = work / "cluster_secret"
        secret.write_text(os.urandom(32).hex() + "\n")
        secret.chmod(0o600)
        port = free_port()
        env = {**os.environ, "JOBSIGHT_DATABASE_URL": database_url, "JOBSIGHT_DATA_DIR": str(work / "data"),
               "JOBSIGHT_PORT": str(port), "JOBSIGHT_SECRET_FILE": str(secret)}
        log = work / "collector.log"
        with open(log, "ab") as out:
            process = subprocess.Popen([sys.executable, "-m", "jobsight", "collector", "--workers", str(workers)],
                                       env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        stack = Stack(database_url, url, "", work, secret, process, postgres_data=server.data_dir)
        try:
            _wait_ready(url, process, log)
            stack.token = (work / "data" / "admin_token").read_text().strip()
            yield stack
        finally:
            stack.stop_collector()
            server.destroy()


def median_time(fn: Callable[[], Any], repeat: int) -> float:
    """Median wall time of ``repeat`` runs after one warm-up, in seconds."""
    fn()
    runs = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - began)
    return statistics.median(runs)
