"""A value the database refuses is the request's fault (422 with a request id in the log),
anything else unexpected stays a 500 with a request id; and the cluster secret a trial
install needs can be created."""

from __future__ import annotations

import logging
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobsight.collector.api.deps import ReadPool
from jobsight.protocol.wire import now_us
from tests.collector.helpers import gz, post


@pytest.fixture
def app_with_probes(database_url: str, data_dir: Path, admin_token: str) -> Iterator[Any]:
    """The real app plus routes that fail inside the real unit of work (``ReadPool`` is imported at
    module level: FastAPI resolves these routes' string annotations there)."""
    from fastapi.testclient import TestClient

    from jobsight.collector.app import create_app
    from jobsight.collector.config.settings import load_collector_settings
    from jobsight.collector.store.db import unit_of_work

    app = create_app(load_collector_settings(database_url=database_url, data_dir=data_dir))

    @app.get("/probe/out-of-range")
    def out_of_range(pool: ReadPool) -> None:
        with unit_of_work(pool) as conn:
            conn.execute("SELECT %s::int", (3_000_000_000,))

    @app.get("/probe/bad-time")
    def bad_time(pool: ReadPool) -> None:
        with unit_of_work(pool) as conn:
            conn.execute("SELECT %s::timestamptz", ("the day after tomorrow",))

    @app.get("/probe/bug")
    def bug(pool: ReadPool) -> None:
        with unit_of_work(pool) as conn:
            conn.execute("SELECT no_such_column FROM jobs")

    with TestClient(app, raise_server_exceptions=False) as test_client:
        test_client.headers["Authorization"] = f"Bearer {admin_token}"
        yield test_client


@pytest.mark.parametrize(("path", "words"), [("/probe/out-of-range", "integer out of range"),
                                             ("/probe/bad-time", "invalid input syntax")])
def test_a_data_error_is_422_logged_with_its_request_id(
    app_with_probes: Any, caplog: pytest.LogCaptureFixture, path: str, words: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="jobsight.collector"):
        response = app_with_probes.get(path)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail["error"].startswith("a value is out of range for the database: ")
    assert words in detail["error"]
    assert (detail["record"], detail["field"]) == (None, None)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and detail["request_id"] in r.getMessage()]
    assert warnings, caplog.text


def test_other_database_errors_stay_500_with_a_request_id(
    app_with_probes: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="jobsight.collector"):
        response = app_with_probes.get("/probe/bug")
    assert response.status_code == 500
    assert response.json()["detail"]["error"] == "internal error"
    assert response.json()["detail"]["request_id"] in caplog.text


def test_a_batch_the_database_refuses_is_422_and_stores_nothing(
    client: Any, db: psycopg.Connection[Any], job_id: str
) -> None:
    # uid is an int4 column: 3e9 fits the wire's integers but not the column. Validation may
    # refuse it at the door (naming the field); if it does not, the database does: 422 either way.
    started = {"kind": "job_started", "job": job_id, "ts": now_us(), "node": "n1", "user": "alice",
               "uid": 3_000_000_000}
    log = {"kind": "log", "job": job_id, "ts": now_us(), "level": "INFO", "message": "kept only with its batch"}
    response = post(client, gz([log, started]))
    assert response.status_code == 422, response.text
    assert response.json()["detail"]["error"]
    assert db.execute("SELECT count(*) FROM log_events WHERE job_id = %s", (job_id,)).fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM jobs WHERE job_id = %s", (job_id,)).fetchone()[0] == 0


def test_ensure_cluster_secret_creates_a_private_secret_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from jobsight.collector.api.auth import ensure_cluster_secret, load_cluster_secret

    path = tmp_path / "new" / "dir" / "cluster_secret"
    with caplog.at_level(logging.DEBUG, logger="jobsight"):
        assert ensure_cluster_secret(path) is True
    secret = path.read_text().strip()
    assert len(secret) >= 64 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert secret not in caplog.text
    assert load_cluster_secret(path) == secret
    # Present: left alone (tokens already minted with it stay valid).
    assert ensure_cluster_secret(path) is False
    assert path.read_text().strip() == secret
    other = tmp_path / "other_secret"
    ensure_cluster_secret(other)
    assert other.read_text() != path.read_text()


def test_a_collector_started_with_an_ensured_secret_accepts_job_tokens(
    database_url: str, data_dir: Path, admin_token: str, tmp_path: Path, job_id: str
) -> None:
    from fastapi.testclient import TestClient

    from jobsight.collector.api.auth import ensure_cluster_secret
    from jobsight.collector.app import create_app
    from jobsight.collector.config.settings import load_collector_settings
    from jobsight.protocol.tokens import mint_job_token

    secret_file = tmp_path / "cluster_secret"
    ensure_cluster_secret(secret_file)
    settings = load_collector_settings(database_url=database_url, data_dir=data_dir, secret_file=secret_file)
    token = mint_job_token(secret_file.read_text().strip(), "default", job_id, 3600)
    log = {"kind": "log", "job": job_id, "ts": now_us(), "level": "INFO", "message": "trial install"}
    with TestClient(create_app(settings)) as test_client:
        assert post(test_client, gz([log]), Authorization=f"Bearer {token}").status_code == 200
