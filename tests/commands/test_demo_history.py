"""The demo's 30 days of simulated history, its settings, its alert sink, and that nothing simulated
is written without ``--demo``."""

from __future__ import annotations

import datetime as dt
import json
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from jobsight.collector.config.settings import SettingsError
from jobsight.collector.query import audit as audit_queries
from jobsight.collector.store import migrate
from jobsight.commands.dashboard import streamlit_argv
from jobsight.commands.demo_history import SOURCE, plan, write_history
from jobsight.commands.demo_settings import load_demo_settings
from jobsight.commands.demo_sink import DemoAlertSink
from jobsight.commands.demo_story import CLUSTER
from tests.collector.test_up import Up

NOW = dt.datetime(2026, 3, 31, 12, tzinfo=dt.UTC)


def test_history_spans_thirty_days_of_users_accounts_and_partitions_and_is_written_once(
    empty_database_url: str,
) -> None:
    migrate.upgrade(empty_database_url)
    written = write_history(empty_database_url, 30, now_s=NOW.timestamp(), seed=3)
    assert written == len(plan(NOW.timestamp(), 30, seed=3)) >= 30
    start = NOW - dt.timedelta(days=30)
    with psycopg.connect(empty_database_url, row_factory=dict_row) as conn:
        jobs = conn.execute(
            "SELECT j.*, s.mean_util, s.energy_kwh FROM jobs j "
            "LEFT JOIN job_summaries s USING (cluster, job_id) WHERE j.cluster = %s", (CLUSTER,)).fetchall()
        assert len(jobs) == written
        assert all(j["demo"] and j["name"].startswith("simulated: ") and j["end_time"] is not None for j in jobs)
        assert all(j["mean_util"] is not None and j["energy_kwh"] > 0 for j in jobs)  # summaries, as ingest makes them
        assert min(j["start_time"] for j in jobs) >= start and max(j["end_time"] for j in jobs) < NOW
        days = conn.execute("SELECT date_trunc('day', start_time) AS day FROM jobs WHERE cluster = %s GROUP BY 1",
                            (CLUSTER,)).fetchall()
        assert len(days) >= 25
        for group, least in (("user_name", 4), ("account", 3), ("partition", 3)):
            rows = audit_queries.gpu_hours_by(conn, group, start, NOW, cluster=CLUSTER, now=NOW)  # type: ignore[arg-type]
            assert len(rows) >= least and all(r["gpu_hours"] > 0 for r in rows), (group, rows)
        idle = audit_queries.underused_allocations(conn, start, NOW, below_percent=5, cluster=CLUSTER, now=NOW)
        low = audit_queries.underused_allocations(conn, start, NOW, below_percent=30, cluster=CLUSTER, now=NOW)
        assert idle and len(low) > len(idle)
        trend = audit_queries.daily_trend(conn, start, NOW, cluster=CLUSTER, now=NOW)
        assert sum(1 for d in trend if d["gpu_hours"] > 0) >= 25
        assert any(d["low_util_gpu_hours"] > 0 for d in trend)
        samples = conn.execute("SELECT count(*) AS n FROM gpu_samples WHERE cluster = %s", (CLUSTER,)).fetchone()
    # Written once: a second start finds the batches of SOURCE and writes nothing.
    assert write_history(empty_database_url, 30, now_s=NOW.timestamp() + 86_400, seed=3) == 0
    with psycopg.connect(empty_database_url, row_factory=dict_row) as conn:
        again = conn.execute("SELECT count(*) AS n FROM gpu_samples WHERE cluster = %s", (CLUSTER,)).fetchone()
        assert again == samples
        assert conn.execute("SELECT count(*) AS n FROM ingest_batches WHERE source = %s",
                            (SOURCE,)).fetchone() == {"n": written}


@pytest.mark.parametrize(("variable", "value"), [("JOBSIGHT_DEMO_STEP_S", "0"), ("JOBSIGHT_DEMO_HEALTHY_S", "soon"),
                                                 ("JOBSIGHT_DEMO_TIME_LIMIT_S", "30")])
def test_a_bad_demo_setting_is_named(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError, match="JOBSIGHT_DEMO_"):
        load_demo_settings()


def test_the_demo_sink_keeps_what_apprise_sends(tmp_path: Path) -> None:
    apprise = pytest.importorskip("apprise")
    announced: list[str] = []
    sink = DemoAlertSink(tmp_path / "alerts.log", announce=announced.append)
    sink.start()
    try:
        notifier = apprise.Apprise()
        assert notifier.add(sink.apprise_url)
        assert notifier.notify(title="jobsight: 1 finding opened", body="rank 11 has stopped stepping")
        assert json.loads(sink.sink_setting()) == [{"name": "demo", "url": sink.apprise_url}]
    finally:
        sink.stop()
    assert sink.received == 1 and announced == ["alert: jobsight: 1 finding opened"]
    assert "rank 11 has stopped stepping" in (tmp_path / "alerts.log").read_text()


def test_the_dashboard_runs_without_the_deploy_toolbar_magic_a_source_watch_or_a_full_gc_a_run() -> None:
    argv = streamlit_argv("127.0.0.1", 8501)
    options = dict(zip(argv[5::2], argv[6::2], strict=True))
    assert options["--client.toolbarMode"] == "minimal"
    assert options["--runner.magicEnabled"] == "false" and options["--server.fileWatcherType"] == "none"
    # A full collection after every run (each page opened, each live refresh) held the GIL for about a
    # tenth of a second while the page's last messages waited to be sent.
    assert options["--runner.postScriptGC"] == "false"
    assert argv[4].endswith("serve.py")


def test_up_without_demo_adds_nothing(tmp_path: Path) -> None:
    """`jobsight up` alone: no simulated cluster, no history, no demo sink, and a quiet console."""
    with Up(tmp_path / "data", tmp_path / "up.log", dashboard=False) as up:
        request = urllib.request.Request(f"{up.url}/v1/jobs?cluster={CLUSTER}",
                                         headers={"Authorization": f"Bearer {up.token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            listed: dict[str, Any] = json.loads(response.read())
        assert up.interrupt() == 0
    assert listed["jobs"] == [] and listed["total"] == 0
    console = (tmp_path / "up.log").read_text()
    assert not any(line.lstrip().startswith(("simulated ", "history ", "alerts ", "demo job ", "alert:"))
                   for line in console.splitlines())
    assert "Running upgrade" not in console and "Uvicorn running" not in console
    assert "collector    http://127.0.0.1" in console
    assert not (tmp_path / "data" / "demo").exists()
