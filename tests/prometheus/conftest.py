"""A real collector (its own database, a cluster secret, a quick health evaluator) for the Prometheus
and Alertmanager tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobsight.collector.store.embedded_db import EmbeddedPostgres
from tests.collector.helpers import SECRET
from tests.conftest import LiveCollector, own_database


@pytest.fixture(scope="module")
def module_database(postgres: EmbeddedPostgres) -> Iterator[str]:
    yield from own_database(postgres, "prom")


def secret_file(folder: Path) -> Path:
    path = folder / "cluster_secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return path


def live_collector(database_url: str, data_dir: Path, admin_token: str, folder: Path, config: str) -> LiveCollector:
    """A collector process (not started) with the cluster secret and ``config`` as its TOML file."""
    (folder / "jobsight.toml").write_text(config)
    return LiveCollector(database_url, data_dir, admin_token, folder / "collector.log", env={
        "JOBSIGHT_CONFIG": str(folder / "jobsight.toml"), "JOBSIGHT_SECRET_FILE": str(secret_file(folder)),
        "JOBSIGHT_DASHBOARD_URL": "https://jobsight.example.org",
    })
