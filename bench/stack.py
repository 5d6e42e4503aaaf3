"""A throwaway embedded PostgreSQL + collector process for benchmarks."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from collector import migrate
from collector.embedded_db import EmbeddedPostgres, free_port

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Stack:
    database_url: str
    url: str
    token: str
    data_dir: Path


@contextmanager
def running_stack(workers: int = 1) -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="jobsight-bench-") as tmp:
        data_dir = Path(tmp)
        os.chmod(data_dir, 0o755)
        server = EmbeddedPostgres(data_dir / "postgres")
        database_url = server.start()
        migrate.upgrade(database_url)
        port = free_port()
        env = {**os.environ, "JOBSIGHT_DATABASE_URL": database_url, "JOBSIGHT_DATA_DIR": str(data_dir),
               "JOBSIGHT_PORT": str(port)}
        process = subprocess.Popen([sys.executable, "-m", "agent.cli", "collector", "--workers", str(workers)],
                                   env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/readyz", timeout=1):
                        break
                except OSError:
                    if time.monotonic() > deadline or process.poll() is not None:
                        raise RuntimeError("collector did not start") from None
                    time.sleep(0.2)
            token = (data_dir / "admin_token").read_text().strip()
            yield Stack(database_url, url, token, data_dir)
        finally:
            process.terminate()
            process.wait(timeout=30)
            server.destroy()
