"""Fixtures shared by the collector tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.collector.helpers import SECRET


@pytest.fixture
def secret_client(database_url: str, data_dir: Path, admin_token: str, tmp_path: Path) -> Iterator[Any]:
    """The collector in-process with a cluster secret (:data:`SECRET`, mode 0600); no default
    auth header, so each request brings its own token."""
    from fastapi.testclient import TestClient

    from jobsight.collector.app import create_app
    from jobsight.collector.config.settings import load_collector_settings

    secret_file = tmp_path / "cluster_secret"
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o600)
    settings = load_collector_settings(database_url=database_url, data_dir=data_dir, secret_file=secret_file)
    with TestClient(create_app(settings)) as test_client:
        yield test_client
