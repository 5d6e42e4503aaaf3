"""Shared fixtures: one real embedded PostgreSQL per test session, the collector app
in-process (``client``) and as a real uvicorn subprocess (``live_collector``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobsight.collector.store import migrate
from jobsight.collector.store.embedded_db import EmbeddedPostgres, free_port

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    """A real PostgreSQL server for the whole session."""
    server = EmbeddedPostgres(tmp_path_factory.mktemp("pg") / "data")
    server.start()
    yield server
    server.destroy()


def create_database(server: EmbeddedPostgres, name: str) -> str:
    with psycopg.connect(server.url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return server.url.rsplit("/", 1)[0] + f"/{name}"


def own_database(server: EmbeddedPostgres, prefix: str) -> Iterator[str]:
    """For a fixture to ``yield from``: a database of its own, migrated to head, dropped after."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    url = create_database(server, name)
    migrate.upgrade(url)
    yield url
    with psycopg.connect(server.url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def database_url(postgres: EmbeddedPostgres) -> str:
    """A database migrated to head, shared by the session (tests use unique job ids)."""
    url = create_database(postgres, "jobsight_test")
    migrate.upgrade(url)
    return url


@pytest.fixture
def empty_database_url(postgres: EmbeddedPostgres) -> str:
    """A fresh, unmigrated database for this test alone."""
    return create_database(postgres, f"t_{uuid.uuid4().hex[:12]}")


@pytest.fixture(scope="session")
def fake_library() -> Path:
    """The fake ``libnvidia-ml.so.1`` (tests/fake_nvml), built with gcc for the real pynvml to load."""
    from tests.fake_nvml.build import GccMissing, build_fake_nvml

    pytest.importorskip("pynvml", reason="nvidia-ml-py (pynvml) is not installed")
    try:
        return build_fake_nvml()
    except GccMissing as exc:
        pytest.skip(f"cannot build the fake libnvidia-ml.so.1: {exc}")


@pytest.fixture
def db(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def job_id() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("jobsight-data")


@pytest.fixture(scope="session")
def admin_token(data_dir: Path) -> str:
    from jobsight.collector.api.auth import ensure_admin_token

    return ensure_admin_token(data_dir / "admin_token")


@pytest.fixture
def client(database_url: str, data_dir: Path, admin_token: str) -> Iterator[Any]:
    """The collector app in-process over the real database, with the admin token set."""
    from fastapi.testclient import TestClient

    from jobsight.collector.app import create_app
    from jobsight.collector.config.settings import load_collector_settings

    settings = load_collector_settings(database_url=database_url, data_dir=data_dir)
    with TestClient(create_app(settings)) as test_client:
        test_client.headers["Authorization"] = f"Bearer {admin_token}"
        yield test_client


class LiveCollector:
    """``jobsight collector`` as a real process on a fixed port, to stop, kill and restart."""

    def __init__(self, database_url: str, data_dir: Path, token: str, log_path: Path,
                 env: dict[str, str] | None = None):
        self.database_url = database_url
        self.env = env or {}
        self.data_dir = data_dir
        self.token = token
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> None:
        env = {
            **os.environ,
            "JOBSIGHT_DATABASE_URL": self.database_url,
            "JOBSIGHT_DATA_DIR": str(self.data_dir),
            "JOBSIGHT_PORT": str(self.port),
            **self.env,
        }
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jobsight", "collector"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"collector exited: {self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        raise RuntimeError(f"collector not ready: {self.log_path.read_text()[-2000:]}")

    def _signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)
            self.process.wait(timeout=30)
        self.process = None

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)


@pytest.fixture
def live_collector(database_url: str, data_dir: Path, admin_token: str, tmp_path: Path) -> Iterator[LiveCollector]:
    collector = LiveCollector(database_url, data_dir, admin_token, tmp_path / "collector.log")
    collector.start()
    yield collector
    collector.kill()
