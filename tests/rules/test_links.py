"""The dashboard's addresses, as jobsight.rules.links builds and reads them."""

from __future__ import annotations

import datetime as dt
from urllib.parse import parse_qs, urlsplit

from jobsight.rules import links

UTC = dt.UTC
MOMENT = dt.datetime(2024, 3, 4, 10, 5, 7, 250_000, tzinfo=UTC)


def test_job_link_with_a_moment_is_absolute_under_the_public_url_and_reads_back() -> None:
    url = links.job_link("prod a", "123_4", MOMENT, base="https://hpc.example/jobsight/")
    assert url == "https://hpc.example/jobsight/job?cluster=prod+a&job=123_4&t=2024-03-04T10:05:07Z"
    query = parse_qs(urlsplit(url).query)
    assert query == {"cluster": ["prod a"], "job": ["123_4"], "t": ["2024-03-04T10:05:07Z"]}
    assert links.parse_moment(query["t"][0]) == MOMENT.replace(microsecond=0)


def test_relative_links_are_what_the_dashboards_tables_hold() -> None:
    assert links.job_link("c", "j") == "job?cluster=c&job=j"
    assert links.audit_link(dt.date(2024, 3, 4), dt.date(2024, 3, 5)) == "audit?from=2024-03-04&to=2024-03-05"
    assert links.jobs_link() == "jobs"
    assert links.jobs_link({"state": "failed", "user": None, "partition": ""}, base="http://h:8501") == (
        "http://h:8501/jobs?state=failed")  # unset filters are left out


def test_moments_in_other_zones_and_without_one_are_utc() -> None:
    paris = dt.timezone(dt.timedelta(hours=1))
    assert links.iso_moment(MOMENT.astimezone(paris)) == "2024-03-04T10:05:07Z"
    assert links.iso_moment(MOMENT.replace(tzinfo=None)) == "2024-03-04T10:05:07Z"  # naive: taken as UTC
    assert links.parse_moment("2024-03-04T11:05:07+01:00") == MOMENT.replace(microsecond=0)
    assert links.parse_moment("2024-03-04 10:05:07") == MOMENT.replace(microsecond=0)
    for bad in (None, "", "yesterday", "2024-13-01T00:00:00Z"):
        assert links.parse_moment(bad) is None


def test_audit_days_read_a_day_or_a_times_utc_day() -> None:
    assert links.parse_day("2024-03-04") == dt.date(2024, 3, 4)
    assert links.parse_day("2024-03-04T23:30:00-02:00") == dt.date(2024, 3, 5)
    for bad in (None, "", "March", "2024-02-30"):
        assert links.parse_day(bad) is None


def test_a_findings_moment_is_its_at_ts_else_when_it_opened() -> None:
    opened = MOMENT + dt.timedelta(minutes=2)
    assert links.finding_moment(MOMENT, opened) == MOMENT
    assert links.finding_moment(None, opened) == opened
    # As a JSON answer gives them.
    assert links.finding_moment("2024-03-04T10:05:07.250000Z", "2024-03-04T10:07:07Z") == MOMENT
    assert links.finding_moment(None, "2024-03-04T10:07:07+00:00") == opened.replace(microsecond=0)
    assert links.finding_moment(None, None) is None
