"""The jobs list, the job page and the audit show a job's end as Slurm names it (TIMEOUT,
OUT_OF_MEMORY, ...), and the audit counts the GPU-hours of time-limit kills and cancelled jobs."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
import pytest
from streamlit.testing.v1 import AppTest

from tests.dashboard.header_facts import header_facts
from tests.dashboard.seed import Seed


@dataclass
class Ended:
    cluster: str
    jobs: dict[str, str]
    """Its end as stored → the job id."""


# (state, exit code, user, GPUs, hours): ended in the last hours, inside the audit's default week.
JOBS = [("timeout", 143, "bob", 2, 3), ("cancelled", 143, "alice", 4, 1), ("failed", 3, "alice", 1, 1),
        ("out_of_memory", 253, "bob", 1, 1), ("completed", 0, "bob", 1, 2)]


@pytest.fixture
def ended(database_url: str, dashboard_env: Seed, monkeypatch: pytest.MonkeyPatch) -> Ended:
    cluster = f"ends-{uuid.uuid4().hex[:8]}"
    end = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(minutes=10)
    jobs = {}
    with psycopg.connect(database_url, autocommit=True) as conn:
        for i, (state, code, user, gpus, hours) in enumerate(JOBS):
            job = f"{9000 + i}"
            conn.execute(
                """INSERT INTO jobs (cluster, job_id, user_name, account, partition, name, nodes, node_count, gpus,
                                     start_time, end_time, state, exit_code, last_seen)
                   VALUES (%s, %s, %s, 'acct', 'gpu', %s, '{n1}', 1, %s, %s, %s, %s, %s, %s)""",
                (cluster, job, user, state, [f"n1:{g}" for g in range(gpus)], end - dt.timedelta(hours=hours), end,
                 state, code, end))
            jobs[state] = job
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_CLUSTER", cluster)
    return Ended(cluster, jobs)


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def test_the_jobs_list_names_states_as_slurm_does(app_as: Callable[..., AppTest], ended: Ended) -> None:
    at = app_as("root")
    _ok(at)
    table = at.dataframe[0].value
    assert dict(zip(table["job"], table["state"], strict=True)) == {
        ended.jobs["timeout"]: "TIMEOUT", ended.jobs["cancelled"]: "CANCELLED", ended.jobs["failed"]: "FAILED",
        ended.jobs["out_of_memory"]: "OUT_OF_MEMORY", ended.jobs["completed"]: "COMPLETED"}
    at.selectbox(key="jobs_state").set_value("out_of_memory").run()
    _ok(at)
    assert list(at.dataframe[0].value["job"]) == [ended.jobs["out_of_memory"]]
    assert at.query_params["state"] == "out_of_memory"  # the address keeps our name


@pytest.mark.parametrize(("state", "shown"), [("timeout", "TIMEOUT (signal 15)"), ("failed", "FAILED (exit code 3)"),
                                              ("completed", "COMPLETED")])
def test_the_job_page_names_its_state_as_slurm_does(
    app_as: Callable[..., AppTest], ended: Ended, state: str, shown: str
) -> None:
    at = app_as("root", "views/job.py", cluster=ended.cluster, job=ended.jobs[state])
    _ok(at)
    assert header_facts(at)["State"] == shown


def test_the_audit_counts_gpu_hours_of_timeouts_and_cancelled_jobs(
    app_as: Callable[..., AppTest], ended: Ended
) -> None:
    at = app_as("root", "views/audit.py")
    _ok(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["GPU-hours ended by time limit"] == "6.00"
    assert metrics["GPU-hours of cancelled jobs"] == "4.00"
    by_user = at.dataframe[0].value.set_index("user")
    assert (by_user.loc["bob", "timeout_gpu_hours"], by_user.loc["bob", "cancelled_gpu_hours"]) == (6.0, 0.0)
    assert (by_user.loc["alice", "timeout_gpu_hours"], by_user.loc["alice", "cancelled_gpu_hours"]) == (0.0, 4.0)
