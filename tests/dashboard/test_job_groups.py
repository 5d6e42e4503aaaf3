"""Array tasks on the jobs list (dashboard/job_groups.py): together under their array, in task order."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable

import psycopg
import pytest
from streamlit.testing.v1 import AppTest

from jobsight.dashboard.job_groups import array_cells, array_of, grouped_order, task_of
from tests.dashboard.seed import Seed


def test_array_tasks_are_recognised_by_their_id() -> None:
    assert (array_of("1234_7"), task_of("1234_7")) == ("1234", 7)
    for plain in ("1234", "local-host-1-2", "test_abc", "1234_", "_7"):
        assert array_of(plain) is None and task_of(plain) is None


def test_an_arrays_tasks_come_together_where_its_first_row_was() -> None:
    # The list's own order (running first, newest first) interleaves two arrays and plain jobs.
    ids = ["900", "77_2", "901", "77_0", "88_1", "77_10", "88_0", "902"]
    order = grouped_order(ids)
    assert [ids[i] for i in order] == ["900", "77_0", "77_2", "77_10", "901", "88_0", "88_1", "902"]
    assert sorted(order) == list(range(len(ids)))  # every row once


def test_the_same_array_id_on_two_clusters_is_two_arrays() -> None:
    ids, clusters = ["5_1", "5_0", "5_2"], ["a", "b", "a"]
    assert [(clusters[i], ids[i]) for i in grouped_order(ids, clusters)] == [("a", "5_1"), ("a", "5_2"), ("b", "5_0")]
    assert array_cells(ids, clusters) == ["5 (2 tasks)", "5 (1 task)", "5 (2 tasks)"]


def test_plain_jobs_have_no_array_cell() -> None:
    assert array_cells(["1", "2_0", "2_1"]) == ["", "2 (2 tasks)", "2 (2 tasks)"]


def test_the_jobs_page_lists_an_arrays_tasks_together(app_as: Callable[..., AppTest], dashboard_env: Seed,
                                                      database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A cluster of its own, so the seeded cluster's pages (tests/dashboard/test_pages.py) stay as seeded.
    cluster, user, array = f"arrays-{uuid.uuid4().hex[:8]}", "alice", "1234"
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_CLUSTER", cluster)
    now = dt.datetime.now(dt.UTC)
    # Newest first would interleave them: 2, plain, 0, 1.
    rows = [(f"{array}_2", 1), (f"{array}-plain", 2), (f"{array}_0", 3), (f"{array}_1", 4)]
    with psycopg.connect(database_url, autocommit=True) as conn:
        for job, minutes_ago in rows:
            conn.execute("""INSERT INTO jobs (cluster, job_id, user_name, state, start_time, end_time, exit_code)
                            VALUES (%s, %s, %s, 'completed', %s, %s, 0)""",
                         (cluster, job, user, now - dt.timedelta(minutes=minutes_ago + 10),
                          now - dt.timedelta(minutes=minutes_ago)))
    at = app_as(user)
    assert not at.exception, [e.value for e in at.exception]
    table = at.dataframe[0].value
    assert list(table["job"]) == [f"{array}_0", f"{array}_1", f"{array}_2", f"{array}-plain"]
    assert list(table["array"]) == [f"{array} (3 tasks)"] * 3 + [""]
    assert "array" in at.dataframe[0].proto.column_order  # shown: a task of an array is listed
