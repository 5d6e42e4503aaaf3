"""One value, one text: a job's user, state, GPU-hours and energy read the same in the jobs list, on the
job's page and in ``jobsight report`` (all through :mod:`jobsight.rules.display_text`); no page shows
"None", "nan", a snake_case header or a negative memory size; and where a page has nothing to show it
says what would fill it (the job page's advice for a flag, the audit's wider period, the Actions
page's missing policy).

On a cluster of its own in the real database, through Streamlit's AppTest and the report's own
function over the collector's own read of the job row.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb
from streamlit.testing.v1 import AppTest

from jobsight.collector.query.jobs import get_job
from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.store.schema import PARTITIONED_TABLES
from jobsight.rules import display_text, links
from jobsight.rules.report_text import format_report
from tests.dashboard.conftest import job_sections, texts
from tests.dashboard.header_facts import header_facts
from tests.dashboard.seed import Seed

UTC = dt.UTC
ENERGY = 2.33605  # kWh: five significant digits keep its last 5, which ".4f" and ".2f" did not agree on


@dataclass(frozen=True)
class Words:
    cluster: str
    slurm: str  # alice's ended Slurm job: a summary, an idle_gpu flag, a profile freeing memory, a log line
    local: str  # a run outside Slurm: no prolog, its process's owner is carol
    start: dt.datetime


@pytest.fixture
def words(dashboard_env: Seed, database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Words]:
    cluster = f"words-{uuid.uuid4().hex[:8]}"
    start = (dt.datetime.now(UTC) - dt.timedelta(days=2)).replace(microsecond=0)
    end = start + dt.timedelta(hours=2)
    w = Words(cluster, "7001", "local-words", start)
    with psycopg.connect(database_url, autocommit=True) as conn:
        keeper = PartitionKeeper()
        for table in PARTITIONED_TABLES:
            keeper.ensure(conn, table, {start.date()})
        conn.execute(
            """INSERT INTO jobs (cluster, job_id, user_name, account, partition, name, nodes, node_count, gpus,
                                 start_time, end_time, state, exit_code, last_seen)
               VALUES (%s, %s, 'alice', 'ml', 'gpu', 'train', '{n1}', 1, '{n1:0,n1:1}', %s, %s, 'completed', 0, %s)""",
            (cluster, w.slurm, start, end, end))
        conn.execute(
            """INSERT INTO job_summaries (cluster, job_id, gpu_count, gpu_hours, mean_util, energy_kwh, flags, summary)
               VALUES (%s, %s, 2, 4.0, 3.0, %s, '{idle_gpu}', %s)""",
            (cluster, w.slurm, ENERGY, Jsonb({"thresholds": {"idle_util": 5, "low_util": 30}})))
        conn.execute(
            """INSERT INTO jobs (cluster, job_id, name, start_time, end_time, state, exit_code, last_seen, attrs)
               VALUES (%s, %s, 'cpu-run', %s, %s, 'completed', 0, %s, %s)""",
            (cluster, w.local, start, end, end, Jsonb({"process": {"user": "carol", "slurm": False}})))
        conn.execute(
            """INSERT INTO log_events (cluster, job_id, ts, node, rank, pid, tid, thread, level, logger, message)
               VALUES (%s, %s, %s, 'n1', NULL, 10, 11, NULL, 'INFO', 'train', 'one process, no rank')""",
            (cluster, w.slurm, start + dt.timedelta(minutes=1)))
        conn.execute(
            """INSERT INTO profiles (cluster, job_id, ts, node, rank, pid, profile_id, step_start, step_end, summary,
                                     diagnosis, trace_gz)
               VALUES (%s, %s, %s, 'n1', NULL, 10, 'prof-w', 1, 3, %s, NULL, %s)""",
            (cluster, w.slurm, start + dt.timedelta(minutes=2),
             Jsonb({"ops_by_self_cpu": [{"name": "aten::empty", "calls": 4, "calls_per_step": 2.0,
                                         "self_cpu_us": 150.0, "cpu_total_us": 200.0, "self_device_us": 0.0,
                                         "cpu_memory_bytes": -2 * 2**20, "device_memory_bytes": 3 * 2**30,
                                         "flops": None, "input_shapes": None}]}),
             gzip.compress(b'{"traceEvents": []}')))
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_CLUSTER", cluster)
    monkeypatch.delenv("JOBSIGHT_ACTIONS_POLICIES", raising=False)
    yield w


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def _headers(element: Any) -> list[str]:
    """The headers a reader sees: each column's label where the page set one, else its name."""
    config = json.loads(element.proto.columns or "{}")
    shown = []
    for name in element.value.columns:
        setting = config.get(str(name)) or {}
        if not setting.get("hidden"):
            shown.append(str(setting.get("label") or name))
    return shown


def _clean(at: AppTest) -> None:
    """No "None", "nan" or "NaT" said anywhere; every table marks missing cells with the one mark, heads
    its columns in words and shows no negative memory."""
    said = texts(at)
    for word in ("None", "nan", "NaT"):
        assert re.search(rf"\b{word}\b", said) is None, (word, said)
    for element in at.dataframe:
        assert element.proto.placeholder == display_text.MISSING
        headers = _headers(element)
        assert not [h for h in headers if display_text.SNAKE_CASE.search(h)], headers
        for header, column in zip(headers, element.value.columns, strict=True):
            if "memory" in header:
                assert all(not str(v).startswith("-") for v in element.value[column]), element.value[column]


def _report_line(text: str, label: str) -> str:
    return next(line.split(": ", 1)[1] for line in text.splitlines() if line.strip().startswith(f"{label}:"))


def test_a_value_reads_the_same_in_the_list_on_the_page_and_in_the_report(
        app_as: Callable[..., AppTest], words: Words, database_url: str) -> None:
    listing = app_as("root")
    listing.selectbox(key="jobs_range").set_value("all time").run()
    _ok(listing)
    table = listing.dataframe[0].value.set_index("job")
    with psycopg.connect(database_url) as conn:
        conn.row_factory = psycopg.rows.dict_row
        rows = {job: get_job(conn, words.cluster, job) for job in (words.slurm, words.local)}
    for job, row in rows.items():
        assert row is not None
        summary = {"gpu_hours": row["gpu_hours"], "energy_kwh": row["energy_kwh"], "flags": row["flags"]}
        report = format_report(row, {"final": True, "summary": summary})
        page = app_as("root", "views/job.py", cluster=words.cluster, job=job)
        _ok(page)
        metrics = header_facts(page)
        user = _report_line(report, "User/Account").split("/")[0]
        assert user == metrics["User"] == table.loc[job, "user"] == display_text.user(row)
        assert _report_line(report, "State") == metrics["State"] == table.loc[job, "state"] == "COMPLETED"
        assert _report_line(report, "Start Time") == display_text.moment(words.start)
        assert _report_line(report, "GPU-hours") == metrics["GPU-hours"]
        assert _report_line(report, "Energy") == table.loc[job, "energy"]
    assert table.loc[words.local, "user"] == "carol" and table.loc[words.local, "partition"] == "n/a"
    assert table.loc[words.slurm, "energy"] == "2.3361 kWh"
    assert table.loc[words.slurm, "flags"] == "idle GPUs"


def test_a_running_jobs_energy_in_the_list_is_its_pages_figure(app_as: Callable[..., AppTest],
                                                                dashboard_env: Seed) -> None:
    listing = app_as("alice")
    _ok(listing)
    cell = listing.dataframe[0].value.set_index("job").loc[dashboard_env.running, "energy"]
    page = app_as("alice", "views/job.py", cluster=dashboard_env.cluster, job=dashboard_env.running, details="energy")
    _ok(page)
    figure = {m.label: m.value for m in page.metric}["GPUs (kWh)"]
    assert figure.startswith(display_text.GROWING) and cell == f"{figure} kWh"


@pytest.mark.parametrize("page", ["jobs", "job", "audit", "actions", "attention"])
def test_no_page_shows_none_nan_snake_case_or_negative_memory(app_as: Callable[..., AppTest], words: Words,
                                                              page: str) -> None:
    sections: dict[str, AppTest] = {}
    if page == "job":  # each of its details sections, drawn one at a time
        sections = job_sections(app_as, "root", cluster=words.cluster, job=words.slurm)
        at = sections["profiles"]
        at.selectbox(key="profile_id").set_value("prof-w").run()
    elif page == "audit":
        at = app_as("root", "views/audit.py", **links.audit_query(words.start.date(), words.start.date()))
    elif page == "jobs":
        at = app_as("root")
        at.selectbox(key="jobs_range").set_value("all time").run()
    else:
        at = app_as("root", f"views/{page}.py")
    for shown in list(sections.values()) or [at]:
        _ok(shown)
        _clean(shown)
    if page == "job":
        ops = next(d.value for d in sections["profiles"].dataframe if "cpu_memory_bytes" in d.value.columns)
        assert list(ops["cpu_memory_bytes"]) == ["frees 2.0 MB"] and list(ops["device_memory_bytes"]) == ["3.0 GB"]
        logs = next(d.value for d in sections["logs"].dataframe if "message" in d.value.columns)
        assert list(logs["rank"]) == [display_text.SINGLE_PROCESS]
    if page == "audit":
        users = set(at.dataframe[0].value["user"])
        assert users == {"alice", "carol"}  # the run outside Slurm under its owner, never a "None" row


def test_the_job_page_gives_the_reports_advice_and_its_gpu_hours(app_as: Callable[..., AppTest],
                                                                  words: Words) -> None:
    at = app_as("alice", "views/job.py", cluster=words.cluster, job=words.slurm)
    _ok(at)
    said = texts(at)
    assert "Request fewer GPUs (--gres=gpu:N)" in said.replace("\\", "")
    assert "idle_gpu" not in said and "Flags:" not in said
    assert header_facts(at)["GPU-hours"] == "4.00"


def test_the_audit_says_what_its_period_holds_and_how_to_widen_it(app_as: Callable[..., AppTest],
                                                                  words: Words) -> None:
    today = dt.datetime.now(UTC).date()
    at = app_as("root", "views/audit.py", **links.audit_query(today, today))
    _ok(at)
    said = texts(at)
    assert f"No job ran in the 1 day(s) from {today:%Y-%m-%d} to {today:%Y-%m-%d} (UTC)" in said
    wider = links.audit_link(today - dt.timedelta(days=29), today)
    assert f"[the last 30 days]({wider})" in said
    # A period with jobs but no idle one: the idle tab says the waste may be older, and where to look.
    at = app_as("root", "views/audit.py", **links.audit_query(words.start.date(), words.start.date()), idle="1")
    _ok(at)
    assert "No ended job's GPUs idled (mean under 1 %)" in texts(at)


def test_the_actions_page_says_no_policy_is_set_and_where_to_set_one(app_as: Callable[..., AppTest], words: Words,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    at = app_as("root", "views/actions.py")
    _ok(at)
    said = texts(at)
    assert "No waste policy is set" in said and "docs/health.md" in said and "[[actions.policies]]" in said
    monkeypatch.setenv("JOBSIGHT_ACTIONS_POLICIES", json.dumps([{
        "name": "gpu-idle", "rule": "idle_allocation", "warn_after_s": 1800, "warn_again_after_s": 3600,
        "act_after_s": 7200, "action": "cancel"}]))
    at = app_as("root", "views/actions.py")
    _ok(at)
    said = texts(at)
    assert "Policies set: gpu-idle (idle_allocation, dry run)" in said and "No waste policy" not in said
