"""Read API parameters PostgreSQL cannot take are a 422 naming the parameter, never a 500:
NUL in any query or path string, integers past their column's range, times that are not
ISO 8601."""

from __future__ import annotations

from typing import Any

import pytest

from tests.collector.helpers import gz, one_of_each, post

BIG = "3000000000"  # past int4
HUGE = "99999999999999999999"  # past int8


@pytest.fixture
def known_job(client: Any, job_id: str) -> str:
    assert post(client, gz(one_of_each(job_id))).status_code == 200
    return job_id


def _names(response: Any) -> list[tuple[str, ...]]:
    detail = response.json()["detail"]
    assert isinstance(detail, list), detail
    return [tuple(str(part) for part in item["loc"]) for item in detail]


@pytest.mark.parametrize(
    ("path", "params", "loc"),
    [
        ("/v1/jobs", {"cluster": "\x00"}, ("query", "cluster")),
        ("/v1/jobs", {"user": "al\x00ice"}, ("query", "user")),
        ("/v1/jobs", {"state": "\x00"}, ("query", "state")),
        ("/v1/jobs", {"partition": "gpu\x00"}, ("query", "partition")),
        ("/v1/jobs/{job}/logs", {"text": "loss\x00"}, ("query", "text")),
        ("/v1/jobs/{job}/logs", {"level": "\x00"}, ("query", "level")),
        ("/v1/jobs/{job}/metrics", {"name": "\x00"}, ("query", "name")),
        ("/v1/jobs/{job}/gpu", {"cluster": "\x00"}, ("query", "cluster")),
        ("/v1/directives", {"job": "1\x002"}, ("query", "job")),
        ("/v1/jobs/a%00b", {}, ("path", "job_id")),
        ("/v1/jobs/a%00b/summary", {}, ("path", "job_id")),
        ("/v1/jobs/a%00b/profiles/1/trace", {}, ("path", "job_id")),
    ],
)
def test_nul_in_a_string_parameter_is_422_naming_it(
    client: Any, known_job: str, path: str, params: dict[str, str], loc: tuple[str, str]
) -> None:
    response = client.get(path.format(job=known_job), params=params)
    assert response.status_code == 422, response.text
    assert loc in _names(response)
    assert "NUL" in response.text


@pytest.mark.parametrize(
    ("path", "params", "name"),
    [
        ("/v1/jobs/{job}/logs", {"rank": BIG}, "rank"),
        ("/v1/jobs/{job}/logs", {"pid": BIG}, "pid"),
        ("/v1/jobs/{job}/logs", {"tid": HUGE}, "tid"),
        ("/v1/jobs/{job}/logs", {"offset": HUGE}, "offset"),
        ("/v1/jobs/{job}/logs", {"limit": HUGE}, "limit"),
        ("/v1/jobs/{job}/metrics", {"rank": BIG}, "rank"),
        ("/v1/jobs/{job}/metrics", {"rank": "-" + BIG}, "rank"),
        ("/v1/jobs/{job}/gpu", {"points": HUGE}, "points"),
        ("/v1/jobs", {"offset": HUGE}, "offset"),
        ("/v1/jobs", {"limit": BIG}, "limit"),
        ("/v1/directives", {"job": "x", "rank": BIG}, "rank"),
        ("/v1/jobs/{job}/profiles", {"limit": HUGE}, "limit"),
        ("/v1/jobs/{job}/profile-requests", {"limit": HUGE}, "limit"),
    ],
)
def test_integers_past_their_column_are_422(
    client: Any, known_job: str, path: str, params: dict[str, str], name: str
) -> None:
    response = client.get(path.format(job=known_job), params=params)
    assert response.status_code == 422, response.text
    assert ("query", name) in _names(response)


def test_ids_in_paths_past_int8_are_422(client: Any, known_job: str) -> None:
    response = client.get(f"/v1/jobs/{known_job}/profiles/{HUGE}/trace")
    assert response.status_code == 422 and ("path", "profile_row_id") in _names(response)
    response = client.post(f"/v1/profile-requests/{HUGE}/state", json={"state": "running"})
    assert response.status_code == 422 and ("path", "request_id") in _names(response)
    # In range but unknown: still a plain 404.
    assert client.get(f"/v1/jobs/{known_job}/profiles/9223372036854775807/trace").status_code == 404
    assert client.post("/v1/profile-requests/9223372036854775807/state", json={"state": "running"}).status_code == 404


def test_a_profile_request_refuses_ranks_and_strings_the_database_cannot_take(client: Any, known_job: str) -> None:
    response = client.post(f"/v1/jobs/{known_job}/profile-requests", json={"steps": 2, "ranks": [0, int(BIG)]})
    assert response.status_code == 422, response.text
    created = client.post(f"/v1/jobs/{known_job}/profile-requests", json={"steps": 2})
    assert created.status_code == 201
    request_id = created.json()["id"]
    response = client.post(f"/v1/profile-requests/{request_id}/state", json={"state": "failed", "reason": "a\x00b"})
    assert response.status_code == 422, response.text
    assert ("body", "reason") in _names(response)


@pytest.mark.parametrize("value", ["0.5", "1700000000", "-1", "1e9", "yesterday", ""])
@pytest.mark.parametrize(("path", "name"), [("/v1/jobs", "since"), ("/v1/jobs", "until"),
                                            ("/v1/jobs/{job}/gpu", "start"), ("/v1/jobs/{job}/logs", "end")])
def test_times_must_be_iso_8601(client: Any, known_job: str, path: str, name: str, value: str) -> None:
    response = client.get(path.format(job=known_job), params={name: value})
    assert response.status_code == 422, response.text
    assert ("query", name) in _names(response)


@pytest.mark.parametrize(
    "params",
    [
        {"start": "2020-01-01T00:00:00"},  # naive: read as UTC, and compared with the job's own (aware) end
        {"end": "2999-01-01"},
        {"start": "0001-01-01T00:00:00Z", "end": "9999-12-31T23:59:59Z"},
        {"start": "2020-01-01T00:00:00+05:00", "end": "2099-01-01T00:00:00-05:00"},
    ],
)
def test_iso_times_of_any_kind_are_answered(client: Any, known_job: str, params: dict[str, str]) -> None:
    for series in ("gpu", "metrics", "steps", "logs"):
        response = client.get(f"/v1/jobs/{known_job}/{series}", params=params)
        assert response.status_code == 200, (series, response.text)
    assert client.get("/v1/jobs", params={"since": "2020-01-01", "until": "2999-01-01T00:00:00Z"}).status_code == 200


def test_a_time_that_leaves_the_calendar_in_utc_is_422(client: Any) -> None:
    response = client.get("/v1/jobs", params={"since": "0001-01-01T00:00:00+01:00"})
    assert response.status_code == 422 and ("query", "since") in _names(response)
