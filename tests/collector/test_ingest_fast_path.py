"""The plain ASGI path of ``POST /v1/ingest`` answers as the FastAPI route does.

The app serves a plain ``POST /v1/ingest`` itself (``CollectorApp``) and leaves one with a
query string to the FastAPI route: the same body posted both ways must get the same status,
headers that matter and JSON, and store the same."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from jobsight.protocol.wire import now_us
from tests.collector.helpers import gz, raw_gz

ROUTE = "/v1/ingest?via=route"  # a query string: the FastAPI route serves it


def _log(job: str, message: str = "ok", **extra: Any) -> dict[str, Any]:
    return {"kind": "log", "job": job, "ts": now_us(), "level": "INFO", "message": message, **extra}


BODIES: dict[str, Callable[[str], bytes]] = {
    "valid": lambda job: gz([_log(job)]),
    "bad-gzip": lambda job: b"\x1f\x8bnot gzip at all",
    "bad-json": lambda job: gzip.compress(b"{not json"),
    "bad-record": lambda job: gz([_log(job), {**_log(job), "level": 7}]),
    "no-records": lambda job: raw_gz({"v": 1, "source": "s", "seq": 1, "records": "none"}),
    "trailing": lambda job: gz([_log(job)]) + b"junk",
}


def _post(client: Any, path: str, body: bytes, headers: dict[str, str]) -> Any:
    return client.post(path, content=body, headers={"Content-Encoding": "gzip", **headers})


@pytest.mark.parametrize("name", list(BODIES))
def test_both_paths_answer_a_body_alike(client: Any, db: psycopg.Connection[Any], job_id: str, name: str) -> None:
    fast = _post(client, "/v1/ingest", BODIES[name](job_id), {})
    route = _post(client, ROUTE, BODIES[name](job_id + "-route"), {})
    assert fast.status_code == route.status_code, (fast.text, route.text)
    assert fast.headers["content-type"] == route.headers["content-type"] == "application/json"
    if fast.status_code == 200:
        assert fast.json()["status"] == route.json()["status"] == "stored"
        assert fast.json()["records"] == route.json()["records"] == 1
        stored = db.execute(
            "SELECT count(*) FROM log_events WHERE job_id IN (%s, %s)", (job_id, job_id + "-route")
        ).fetchone()
        assert stored is not None and stored[0] == 2
    else:
        assert fast.status_code in (400, 422), fast.text
        assert fast.json() == route.json()


@pytest.mark.parametrize(
    ("authorization", "status"),
    [(None, 401), ("Basic abc", 401), ("Bearer not-a-token", 401)],
    ids=["none", "not-bearer", "unknown-token"],
)
def test_both_paths_refuse_a_bad_token_alike(
    client: Any, job_id: str, authorization: str | None, status: int
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    del client.headers["Authorization"]
    fast = _post(client, "/v1/ingest", gz([_log(job_id)]), headers)
    route = _post(client, ROUTE, gz([_log(job_id)]), headers)
    assert fast.status_code == route.status_code == status
    assert fast.headers["www-authenticate"] == route.headers["www-authenticate"] == "Bearer"
    assert fast.json() == route.json()


def test_a_body_over_the_limit_is_refused_on_both_paths(client: Any, job_id: str) -> None:
    limit = client.app.state.settings.max_body_bytes
    body = b"\x00" * limit
    fast = _post(client, "/v1/ingest", body, {})
    route = _post(client, ROUTE, body, {})
    assert fast.status_code == route.status_code == 413
    assert fast.json() == route.json()


def test_rejects_are_counted_on_the_fast_path(client: Any, job_id: str) -> None:
    def rejected() -> float:
        text = client.get("/metrics").text
        lines = [line for line in text.splitlines()
                 if line.startswith("jobsight_ingest_rejects_total") and 'reason="bad_body"' in line]
        return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0

    before = rejected()
    assert _post(client, "/v1/ingest", b"\x1f\x8bbroken", {}).status_code == 400
    assert rejected() == before + 1
