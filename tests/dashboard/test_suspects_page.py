"""Suspect GPUs on the dashboard: the admins' page of GPUs that kept hurting jobs, with the line
that would drain each one's node (only for a GPU that hurt the site's ``suspect_alert_jobs``, 3 by
default; fewer is "worth watching"), and the Xid marks on a job page's timeline, over rows written
with SQL as the collector stores them (``gpu_events``, collector/ingest).

The cluster's Xids, by job (every job has its row; ``x-1`` has 40 minutes of GPU samples):

| job | user  | node          | GPU | Xid | when           | on the page                                     |
| x-1 | alice | n7            | 3   | 79  | 20 minutes ago | n7/3, three jobs, drain line; marked on its page|
| x-2 | bob   | n7            | 3   | 79  | 2 days ago     | n7/3                                            |
| x-6 | frank | n7            | 3   | 79  | 3 days ago     | n7/3                                            |
| x-3 | carol | (hostile)     | 0   | 48  | 1 day ago      | listed as text, no drain line                   |
| x-4 | dave  | n9            | 1   | 79  | 10 days ago    | only over 30 days: one job, worth watching      |
| x-5 | erin  | n8            | 0   | 13  | 1 hour ago     | never: the application's own Xid                |

The hostile node is ``n1;rm -rf / `reboot` [x](https://evil)``: a shell command and Markdown in one name.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.store.schema import PARTITIONED_TABLES
from jobsight.collector.tiers.rollup import rebuild_minutes
from jobsight.dashboard import data
from jobsight.dashboard.identity import Viewer
from tests.conftest import REPO
from tests.dashboard.conftest import texts
from tests.dashboard.seed import Seed
from tests.dashboard.test_hostile_markup import markdown_sources, reading

UTC = dt.UTC
HOSTILE_NODE = "n1;rm -rf / `reboot` [x](https://evil)"
FELL_OFF = "Xid 79 (GPU fell off the bus)"
DRAIN_N7 = f"scontrol update NodeName=n7 State=DRAIN Reason='jobsight: GPU 3 hurt 3 jobs ({FELL_OFF} ×3)'"
# (job, user, node, GPU, Xid, how long ago)
XIDS = [("x-1", "alice", "n7", 3, 79, dt.timedelta(minutes=20)),
        ("x-2", "bob", "n7", 3, 79, dt.timedelta(days=2)),
        ("x-6", "frank", "n7", 3, 79, dt.timedelta(days=3)),
        ("x-3", "carol", HOSTILE_NODE, 0, 48, dt.timedelta(days=1)),
        ("x-4", "dave", "n9", 1, 79, dt.timedelta(days=10)),
        ("x-5", "erin", "n8", 0, 13, dt.timedelta(hours=1))]
RUN = dt.timedelta(minutes=40)
"""How long alice's x-1 has been running."""


@pytest.fixture(scope="module")
def suspects_seed(database_url: str) -> str:
    cluster = f"suspects-{uuid.uuid4().hex[:8]}"
    now = dt.datetime.now(UTC).replace(microsecond=0)
    with psycopg.connect(database_url, autocommit=True) as conn:
        keeper = PartitionKeeper()
        for table in PARTITIONED_TABLES:
            keeper.ensure(conn, table, {(now - ago).date() for *_, ago in XIDS} | {(now - RUN).date(), now.date()})
        with conn.transaction():
            for job, user, node, gpu, code, ago in XIDS:
                running = job == "x-1"
                start = now - (RUN if running else ago + dt.timedelta(hours=1))
                end = None if running else now - ago + dt.timedelta(minutes=5)
                conn.execute(
                    """INSERT INTO jobs (cluster, job_id, user_name, account, partition, name, nodes, node_count,
                                         gpus, start_time, end_time, state, exit_code, last_seen)
                       VALUES (%s, %s, %s, 'ml', 'gpu', %s, %s, 1, %s, %s, %s, %s, %s, %s)""",
                    (cluster, job, user, f"train-{job}", [node], [f"{node}:{gpu}"], start, end,
                     "running" if running else "failed", None if running else 1, end or now))
                conn.execute(
                    """INSERT INTO gpu_events (cluster, job_id, ts, node, gpu_index, gpu_uuid, event, code)
                       VALUES (%s, %s, %s, %s, %s, %s, 'xid', %s)""",
                    (cluster, job, now - ago, node, gpu, f"GPU-{node}-{gpu}", code))
            # 40 minutes of x-1's GPU every 10 s: its page draws the GPU's lines, the timeline marks over them.
            conn.execute(
                """INSERT INTO gpu_samples (cluster, job_id, ts, node, gpu_index, gpu_uuid, gpu_name, util_gpu,
                                            util_mem, mem_used, mem_total, power_w, energy_j, temp_c, lost)
                   SELECT %(c)s, 'x-1', %(s)s + make_interval(secs => t), 'n7', 3, 'GPU-n7-3', 'NVIDIA H100', 90,
                          30, 20 * 2^30, 80 * 2^30, 500, t * 500.0, 60, false
                   FROM generate_series(0, %(n)s, 10) t""",
                {"c": cluster, "s": now - RUN, "n": int(RUN.total_seconds()) - 10})
            rebuild_minutes(conn, cluster, "x-1")
    return cluster


@pytest.fixture
def suspects(dashboard_env: Seed, suspects_seed: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_CLUSTER", suspects_seed)
    yield suspects_seed


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def _listed(at: AppTest) -> dict[str, dict[str, Any]]:
    """The page's table, a row per GPU by its name, in the order shown (``_order`` holds it)."""
    table = at.dataframe[0].value
    return {row["GPU"]: {**row, "_order": index} for index, row in enumerate(table.to_dict("records"))}


# -- the Suspect GPUs page --------------------------------------------------------------------------


def test_an_admin_sees_the_gpu_that_fell_off_the_bus_with_its_jobs_and_drain_line(
        app_as: Callable[..., AppTest], suspects: str) -> None:
    at = app_as("root", "views/suspects.py")
    _ok(at)
    assert [t.value for t in at.title] == ["Suspect GPUs"]
    listed = _listed(at)
    # The week: n7/3 (three jobs, first) and the hostile node's GPU; not n9/1 (ten days ago), nor n8/0 (Xid 13).
    assert list(listed) == ["n7/3", f"{HOSTILE_NODE}/0"]
    n7 = listed["n7/3"]
    assert (n7["cluster"], n7["jobs"], n7["users"], list(n7["job ids"]), n7["what it did"]) == (
        suspects, 3, 3, ["x-1", "x-2", "x-6"], f"{FELL_OFF} ×3")
    assert abs(n7["last seen"] - (dt.datetime.now(UTC) - dt.timedelta(minutes=20))) < dt.timedelta(minutes=5)
    assert [c.value for c in at.code] == [DRAIN_N7]
    assert any("jobsight never drains a node by itself" in c.value for c in at.caption)
    # Each GPU's jobs open their pages, linked as the other pages link jobs.
    jobs = at.dataframe[1].value
    assert list(jobs["job"]) == ["x-1", "x-2", "x-6"]
    assert list(jobs["open"]) == [f"job?cluster={suspects}&job={j}" for j in ("x-1", "x-2", "x-6")]
    assert "n8" not in texts(at)


def test_the_period_reaches_further_back_and_stays_in_the_address(app_as: Callable[..., AppTest],
                                                                   suspects: str) -> None:
    at = app_as("root", "views/suspects.py")
    assert "n9/1" not in _listed(at)
    at.number_input(key="suspects_days").set_value(30).run()
    _ok(at)
    assert at.query_params == {"days": "30"}
    listed = _listed(at)
    assert list(listed) == ["n7/3", f"{HOSTILE_NODE}/0", "n9/1"]
    assert listed["n9/1"]["what it did"] == f"{FELL_OFF} ×1"
    assert [c.value for c in at.code] == [DRAIN_N7]  # n9/1 hurt one job: watched, not drained
    # Opened from the address, a day back finds only the last hour's Xid of x-1.
    at = app_as("root", "views/suspects.py", days="1")
    _ok(at)
    assert list(_listed(at)) == ["n7/3"] and _listed(at)["n7/3"]["jobs"] == 1


def test_a_gpu_that_hurt_one_job_is_worth_watching_and_gets_no_drain_line(app_as: Callable[..., AppTest],
                                                                         suspects: str) -> None:
    """An Xid 79 in one job of ten days ago: listed, said to be worth watching, never a drain line."""
    at = app_as("root", "views/suspects.py", days="30")
    _ok(at)
    assert _listed(at)["n9/1"]["jobs"] == 1
    code = "\n".join(c.value for c in at.code)
    assert "NodeName=n9" not in code and code == DRAIN_N7
    watching = [i.value for i in at.info if i.value.startswith("Worth watching")]
    # The hostile node's GPU (one job) and n9/1 (one job) are watched; n7/3 (three jobs) is not.
    assert watching == ["Worth watching: it hurt 1 job(s) of 1 user(s). A drain is suggested from 3 jobs on "
                        "(suspect_alert_jobs)."] * 2, watching


def test_the_sites_threshold_decides_the_drain_line(app_as: Callable[..., AppTest], suspects: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``JOBSIGHT_HEALTH_SUSPECT_ALERT_JOBS``: at 4, even n7/3's three jobs are only worth watching; at 1,
    n9/1's one job gets its line (the site chose so)."""
    monkeypatch.setenv("JOBSIGHT_HEALTH_SUSPECT_ALERT_JOBS", "4")
    at = app_as("root", "views/suspects.py", days="30")
    _ok(at)
    assert not at.code
    assert len([i for i in at.info if i.value.startswith("Worth watching")]) == 3
    monkeypatch.setenv("JOBSIGHT_HEALTH_SUSPECT_ALERT_JOBS", "1")
    at = app_as("root", "views/suspects.py", days="30")
    _ok(at)
    assert "scontrol update NodeName=n9 State=DRAIN" in "\n".join(c.value for c in at.code)


def test_a_hostile_node_name_is_shown_as_text_and_gets_no_drain_line(app_as: Callable[..., AppTest],
                                                                      suspects: str) -> None:
    at = app_as("root", "views/suspects.py")
    _ok(at)
    hostile = _listed(at)[f"{HOSTILE_NODE}/0"]
    assert (hostile["jobs"], hostile["what it did"]) == (1, "Xid 48 (double-bit ECC error) ×1")
    # No line names it: the only code on the page is n7's, and nothing a shell would run carries "rm".
    assert [c.value for c in at.code] == [DRAIN_N7]
    [refused] = [w.value for w in at.warning if w.value.startswith("No drain line")]
    assert reading(refused) == (f"No drain line: the node's name {HOSTILE_NODE} is not a plain host name, so "
                                "jobsight puts it in no command.", [])
    assert f"{HOSTILE_NODE}/0 · cluster {suspects} · 1 job(s)" in [reading(m.value)[0] for m in at.markdown]
    for source in markdown_sources(at):
        assert reading(source)[1] == [], source


def test_the_suspects_page_is_not_offered_to_users(app_as: Callable[..., AppTest], suspects: str) -> None:
    at = app_as("alice")
    _ok(at)
    with pytest.raises(ValueError):
        at.switch_page("views/suspects.py")  # not registered for a non-admin at all
    # Run as a script of its own (no navigation), the page still refuses.
    page = AppTest.from_file(str(REPO / "dashboard" / "views" / "suspects.py"), default_timeout=60)
    page.user = {"is_logged_in": True, "preferred_username": "alice"}
    page.run()
    _ok(page)
    assert [e.value for e in page.error] == ["The suspect GPUs are for admins only."]
    assert not page.dataframe and not page.code and "n7" not in texts(page)
    now = dt.datetime.now(UTC)
    with pytest.raises(PermissionError):
        data.suspects(Viewer("alice", is_admin=False), now - dt.timedelta(days=7), now, cluster=suspects)


# -- the job page's timeline ------------------------------------------------------------------------


def _marks_drawn(at: AppTest) -> list[tuple[str, str]]:
    """(kind, label) of every timeline marker the page's charts carry, as Streamlit ships their data."""
    drawn: list[tuple[str, str]] = []
    for element in at.get("vega_lite_chart"):
        for dataset in element.proto.datasets:
            table = pa.ipc.open_stream(dataset.data.data).read_all()
            if {"kind", "label"} <= set(table.column_names):
                drawn += zip(table["kind"].to_pylist(), table["label"].to_pylist(), strict=True)
    return drawn


def test_the_job_page_marks_its_xid_on_the_timeline(app_as: Callable[..., AppTest], suspects: str) -> None:
    # The Xid is 20 min back; the job has no steps, so its nodes' GPU lines carry the markers.
    at = app_as("alice", "views/job.py", cluster=suspects, job="x-1", window="all", details="nodes")
    _ok(at)
    drawn = _marks_drawn(at)
    assert drawn, "no chart carried the timeline markers"
    assert set(drawn) == {("xid", f"{FELL_OFF} on n7/3")}  # its own Xid only, not bob's on the same GPU
    # The marker has a colour of its own in the legend.
    assert '"xid"' in "".join(element.proto.spec for element in at.get("vega_lite_chart"))
