"""The reconciliation pass's rules for runs outside Slurm (collector/passes/local_runs.py), with the
pass's clock given: records are stored through the collector's own ingest path, on a database of
this test's own (a pass reads every running job). The runs of real scripts are in
tests/frameworks/test_local_run_end.py."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobsight.collector.config.reconcile import load_reconcile_settings
from jobsight.collector.config.settings import SettingsError
from jobsight.collector.passes.reconcile import JobReconciler
from tests.collector.test_reconcile import NO_SLURM, S, conn, fresh_url, job_row, started, store

__all__ = ["conn", "fresh_url"]  # fixtures


def local(name: str) -> str:
    return f"local-ws-{name}-{uuid.uuid4().hex[:6]}"


def event(job: str, ts: int, name: str, pid: int, node: str = "ws", rank: int | None = None) -> dict[str, Any]:
    return {"kind": "log", "job": job, "ts": ts, "node": node, "rank": rank, "pid": pid, "level": "INFO",
            "logger": "jobsight.run", "message": name, "attrs": {"event": name}}


def step(job: str, ts: int, pid: int, rank: int | None = None) -> dict[str, Any]:
    return {"kind": "step", "job": job, "ts": ts, "node": "ws", "rank": rank, "pid": pid, "step": 0,
            "duration_s": 0.1}


def reconciler(**settings: Any) -> JobReconciler:
    return JobReconciler(load_reconcile_settings(**NO_SLURM, **settings))


def test_a_run_ends_when_every_process_that_started_has_ended_not_when_the_first_does(
    conn: psycopg.Connection[dict[str, Any]],
) -> None:
    """torchrun's two ranks under one local id: rank 0 ending leaves the job running; rank 1 ending by an
    exception ends it ``failed``, at that end, with its summary."""
    now = time.time()
    t0 = int((now - 100) * S)
    job = local("two")
    store(conn, [event(job, t0, "run_start", 10, rank=0), event(job, t0, "run_start", 11, rank=1),
                 step(job, t0 + S, 10, 0), step(job, t0 + S, 11, 1), event(job, t0 + 2 * S, "run_end", 10, rank=0)])
    pass_ = reconciler()
    assert pass_.reconcile_once(conn, now=now).local == {}
    assert job_row(conn, job)["state"] == "running"

    store(conn, [event(job, t0 + 3 * S, "exception", 11, rank=1)])
    assert pass_.reconcile_once(conn, now=now + 60).local == {("default", job): "failed"}
    row = job_row(conn, job)
    assert (row["state"], row["exit_code"], row["end_time"].timestamp()) == ("failed", None, (t0 + 3 * S) / S)
    assert row["attrs"] == {"end_source": "processes",
                            "end_reason": "2 processes of the run said they all ended (1 by an exception)"}
    assert conn.execute("SELECT 1 FROM job_summaries WHERE job_id = %s", (job,)).fetchone()


def test_an_end_before_the_process_started_again_or_while_records_arrive_ends_nothing(
    conn: psycopg.Connection[dict[str, Any]],
) -> None:
    """A second ``fit`` in the same process: the first one's end is not the run's. A run whose processes
    all ended but whose records still arrive (within ``ended_quiet_s``) is not ended yet."""
    now = time.time()
    t0 = int((now - 100) * S)
    again, busy = local("again"), local("busy")
    store(conn, [event(again, t0, "fit_start", 10), event(again, t0 + S, "fit_end", 10),
                 event(again, t0 + 2 * S, "fit_start", 10), step(again, t0 + 3 * S, 10),
                 event(busy, t0, "fit_start", 20), event(busy, t0 + S, "fit_end", 20),
                 step(busy, int((now - 5) * S), 20)])
    pass_ = reconciler(ended_quiet_s=30)
    assert pass_.reconcile_once(conn, now=now).local == {}
    assert pass_.reconcile_once(conn, now=now + 30).local == {("default", busy): "completed"}
    store(conn, [event(again, t0 + 4 * S, "fit_end", 10)])
    assert pass_.reconcile_once(conn, now=now + 60).local == {("default", again): "completed"}
    assert job_row(conn, again)["end_time"].timestamp() == (t0 + 4 * S) / S


def test_a_silent_run_outside_slurm_ends_silent_and_only_such_a_run(
    conn: psycopg.Connection[dict[str, Any]],
) -> None:
    """Silence for ``silent_after_s`` ends a run outside Slurm with a process that never said it ended,
    or with no process at all (records posted by hand), as ``silent`` at its last record. Not a Slurm
    job without a prolog (the lost rule's, after ``no_limit_silent_s``), not a job a prolog registered
    under a local-looking id, not a demo job."""
    now = time.time()
    t0 = int((now - 50) * S)
    killed, by_hand, registered, demo = (local(name) for name in ("killed", "curl", "registered", "demo"))
    slurm = str(800_000_000 + uuid.uuid4().int % 10**6)
    store(conn, [event(killed, t0, "run_start", 10), step(killed, t0 + S, 10),
                 step(by_hand, t0, 1),
                 event(slurm, t0, "run_start", 10), event(slurm, t0 + S, "run_end", 10),
                 started(registered, t0), step(registered, t0 + S, 10),
                 {"kind": "job_started", "job": demo, "ts": t0, "node": "ws", "demo": True}, step(demo, t0, 10)])
    pass_ = reconciler(silent_after_s=300)
    assert pass_.reconcile_once(conn, now=now + 200).local == {}
    result = pass_.reconcile_once(conn, now=now + 400)
    assert result.local == {("default", killed): "silent", ("default", by_hand): "silent"}
    assert result.lost == []
    row = job_row(conn, killed)
    assert (row["state"], row["end_time"], row["attrs"]["end_source"]) == ("silent", row["last_seen"], "reconcile")
    assert "(0 of 1 process said they ended)" in row["attrs"]["end_reason"]
    assert "(no process said it started or ended)" in job_row(conn, by_hand)["attrs"]["end_reason"]
    assert {j: job_row(conn, j)["state"] for j in (slurm, registered, demo)} == dict.fromkeys(
        (slurm, registered, demo), "running")


def test_silence_counts_from_the_reconciler_start_and_zero_turns_it_off(
    conn: psycopg.Connection[dict[str, Any]],
) -> None:
    """A collector back from a long outage does not end runs whose spools it has yet to receive; with
    ``silent_after_s = 0`` no run ends as silent."""
    now = time.time()
    job = local("outage")
    store(conn, [event(job, int((now - 3600) * S), "run_start", 10)])
    assert reconciler(silent_after_s=600).reconcile_once(conn, now=now + 300).local == {}
    assert reconciler(silent_after_s=0).reconcile_once(conn, now=now + 10**6).local == {}
    assert reconciler(silent_after_s=600).reconcile_once(conn, now=now + 700).local == {("default", job): "silent"}


def test_an_epilog_or_the_processes_heard_later_replace_silent(conn: psycopg.Connection[dict[str, Any]]) -> None:
    now = time.time()
    job = local("late")
    store(conn, [event(job, int((now - 10) * S), "run_start", 10)])
    reconciler(silent_after_s=60).reconcile_once(conn, now=now + 100)
    assert job_row(conn, job)["state"] == "silent"
    store(conn, [{"kind": "job_ended", "job": job, "ts": int(now * S), "node": "ws", "exit_code": 0}])
    assert job_row(conn, job)["state"] == "completed"


def test_the_settings_are_read_and_bad_values_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "jobsight.toml"
    config.write_text("[reconcile]\nsilent_after_s = 1200\n")
    monkeypatch.setenv("JOBSIGHT_CONFIG", str(config))
    monkeypatch.setenv("JOBSIGHT_RECONCILE_ENDED_QUIET_S", "3")
    settings = load_reconcile_settings()
    assert (settings.silent_after_s, settings.ended_quiet_s) == (1200.0, 3.0)
    assert type(settings).model_fields["silent_after_s"].default == 600.0
    monkeypatch.setenv("JOBSIGHT_RECONCILE_SILENT_AFTER_S", "-5")
    with pytest.raises(SettingsError, match="JOBSIGHT_RECONCILE_SILENT_AFTER_S"):
        load_reconcile_settings()

