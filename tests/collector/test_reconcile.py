"""Reconciliation without Slurm: a job whose epilog never posts is ``lost`` after its time limit plus
the grace (shortened here), with its summary; never before, never ``running`` again; the commands'
failures and timeouts cost a pass nothing; one leader. Each test has a database of its own, since a
pass reads every running job. The Slurm side (sacct/scontrol on a real cluster) is in
tests/slurm/test_reconcile_slurm.py."""

from __future__ import annotations

import datetime as dt
import json
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from jobsight.collector.config.reconcile import load_reconcile_settings
from jobsight.collector.config.settings import SettingsError
from jobsight.collector.ingest import write as ingest
from jobsight.collector.ingest.body import decode_body
from jobsight.collector.passes.reconcile import JobReconciler, Reconciler
from jobsight.collector.passes.slurm_jobs import parse_sacct, parse_squeue
from jobsight.collector.store import migrate
from jobsight.collector.store.embedded_db import EmbeddedPostgres
from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.protocol.wire import now_us
from tests.collector.helpers import gz
from tests.conftest import LiveCollector, create_database

NO_SLURM = {"sacct": "/nonexistent/sacct", "squeue": "/nonexistent/squeue"}
S = 1_000_000


@pytest.fixture
def fresh_url(postgres: EmbeddedPostgres) -> str:
    url = create_database(postgres, f"r_{uuid.uuid4().hex[:12]}")
    migrate.upgrade(url)
    return url


@pytest.fixture
def conn(fresh_url: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    with psycopg.connect(fresh_url, autocommit=True, row_factory=dict_row) as c:
        yield c


def started(job: str, ts: int, **fields: Any) -> dict[str, Any]:
    return {"kind": "job_started", "job": job, "ts": ts, "node": "n1", "user": "alice", "account": "ml",
            "partition": "gpu", "nodes": ["n1", "n2"], "gpus": ["0"], **fields}


def gpu(job: str, ts: int, node: str = "n1") -> dict[str, Any]:
    return {"kind": "gpu_sample", "job": job, "ts": ts, "node": node, "gpu_index": 0, "gpu_uuid": f"GPU-{node}",
            "util_gpu": 50.0, "power_w": 300.0, "mem_used": 2**30, "mem_total": 80 * 2**30}


def post(url: str, token: str, records: list[dict[str, Any]]) -> None:
    request = urllib.request.Request(f"{url}/v1/ingest", data=gz(records, source=f"t-{uuid.uuid4().hex}"),
                                     headers={"Content-Encoding": "gzip", "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def store(conn: psycopg.Connection[dict[str, Any]], records: list[dict[str, Any]]) -> None:
    """Through the collector's own ingest path, in-process."""
    item = decode_body(gz(records, source=f"t-{uuid.uuid4().hex}"), "gzip", 128 * 2**20)
    ingest.ensure_partitions(conn, PartitionKeeper(), item[1])
    with conn.transaction():
        ingest.store_group(conn, [item])


def job_row(conn: psycopg.Connection[dict[str, Any]], job: str) -> dict[str, Any]:
    row = conn.execute("SELECT * FROM jobs WHERE job_id = %s", (job,)).fetchone()
    assert row is not None
    return row


def test_a_job_whose_epilog_never_posts_is_lost_after_its_limit_plus_grace_and_stays_ended(
    fresh_url: str, data_dir: Path, admin_token: str, tmp_path: Path,
) -> None:
    """The acceptance path on a real collector process: only job_started and samples from two nodes
    arrive, no job_ended; with a 1 s limit and 2 s of grace the pass (every 0.3 s) ends it as lost,
    at its last record, with the reason and a summary. A replayed job_started and late samples leave
    it ended; an epilog heard later still says how it really ended."""
    env = {"JOBSIGHT_RECONCILE_INTERVAL_S": "0.3", "JOBSIGHT_RECONCILE_GRACE_S": "2",
           "JOBSIGHT_RECONCILE_SACCT": NO_SLURM["sacct"], "JOBSIGHT_RECONCILE_SQUEUE": NO_SLURM["squeue"]}
    collector = LiveCollector(fresh_url, data_dir, admin_token, tmp_path / "collector.log", env=env)
    collector.start()
    job = f"rec-{uuid.uuid4().hex[:10]}"
    t0 = now_us() - 3 * S
    try:
        post(collector.url, admin_token, [started(job, t0, time_limit_s=1), gpu(job, t0 + S), gpu(job, t0 + 2 * S),
                                          gpu(job, t0 + 2 * S, node="n2")])
        with psycopg.connect(fresh_url, autocommit=True, row_factory=dict_row) as conn:
            deadline = time.monotonic() + 60
            while job_row(conn, job)["state"] == "running" and time.monotonic() < deadline:
                time.sleep(0.2)
            row = job_row(conn, job)
            assert row["state"] == "lost", collector.log_path.read_text()[-3000:]
            assert row["exit_code"] is None
            assert row["end_time"] == dt.datetime.fromtimestamp((t0 + 2 * S) / S, dt.UTC)
            reason = row["attrs"]["end_reason"]
            assert "no record from n1, n2 since" in reason and "time limit of 0:00:01 plus 2 s of grace" in reason
            assert "not a Slurm job" in reason
            summary = conn.execute("SELECT gpu_count, summary FROM job_summaries WHERE job_id = %s",
                                   (job,)).fetchone()
            assert summary is not None and summary["gpu_count"] == 2
            assert summary["summary"]["elapsed_s"] == pytest.approx(2.0)

            # A spool replayed late: the prolog's job_started again, a sample. Still ended.
            post(collector.url, admin_token, [started(job, t0, time_limit_s=1), gpu(job, now_us())])
            assert job_row(conn, job)["state"] == "lost"
            # The epilog, heard at last, knows more than "lost".
            post(collector.url, admin_token, [{"kind": "job_ended", "job": job, "ts": t0 + 3 * S, "node": "n1",
                                               "state": "TIMEOUT", "exit_code": 143}])
            row = job_row(conn, job)
            assert (row["state"], row["exit_code"]) == ("timeout", 143)
    finally:
        collector.kill()


def test_not_lost_while_within_its_limit_or_still_heard(conn: psycopg.Connection[dict[str, Any]]) -> None:
    """The rule's edges, with the pass's clock given: past the limit but heard from within the grace;
    silent but within limit plus grace; no limit and silent for less than ``no_limit_silent_s``."""
    now = time.time()
    base = int(now * S)
    heard, within, unlimited = (f"{name}-{uuid.uuid4().hex[:6]}" for name in ("heard", "within", "unlimited"))
    store(conn, [started(heard, base - 1000 * S, time_limit_s=100), gpu(heard, base - 10 * S),
                 started(within, base - 200 * S, time_limit_s=3600), gpu(within, base - 190 * S),
                 started(unlimited, base - 500 * S), gpu(unlimited, base - 400 * S)])
    store(conn, [{"kind": "log", "job": heard, "ts": base - 10 * S, "node": "n1", "level": "INFO", "message": "x"}])
    reconciler = JobReconciler(load_reconcile_settings(grace_s=60, no_limit_silent_s=1000, **NO_SLURM))
    assert reconciler.sacct is None and reconciler.squeue is None

    result = reconciler.reconcile_once(conn, now=now)
    assert result.lost == [] and result.running == 3
    assert {job_row(conn, j)["state"] for j in (heard, within, unlimited)} == {"running"}

    # 100 s on: "heard" has been silent past the grace; the others are still inside their bounds.
    assert [j for _, j in reconciler.reconcile_once(conn, now=now + 100).lost] == [heard]
    # Past 3600 + 60 s after its start and silent: "within" too. "unlimited": silent 1000 s → lost.
    lost = reconciler.reconcile_once(conn, now=now + 3600).lost
    assert sorted(j for _, j in lost) == sorted([within, unlimited])
    assert "no time limit" in job_row(conn, unlimited)["attrs"]["end_reason"]
    assert reconciler.reconcile_once(conn, now=now + 7200).running == 0


def test_a_slurm_command_that_hangs_or_fails_costs_the_pass_nothing(
    conn: psycopg.Connection[dict[str, Any]], tmp_path: Path,
) -> None:
    """``squeue`` that never answers is killed at the timeout, ``sacct`` on a cluster without
    accounting exits 1: the pass says why, once in the log, and the lost rule still applies."""
    hangs = tmp_path / "squeue"
    hangs.write_text("#!/bin/sh\nexec sleep 30\n")
    refuses = tmp_path / "sacct"
    refuses.write_text("#!/bin/sh\necho 'Slurm accounting storage is disabled' >&2\nexit 1\n")
    for script in (hangs, refuses):
        script.chmod(0o755)
    now = time.time()
    job = str(900_000_000 + uuid.uuid4().int % 1_000_000)  # a Slurm-shaped id, asked of both commands
    store(conn, [started(job, int((now - 100) * S), time_limit_s=10), gpu(job, int((now - 95) * S))])
    reconciler = JobReconciler(load_reconcile_settings(grace_s=30, command_timeout_s=0.5, sacct=str(refuses),
                                                       squeue=str(hangs)))
    result = reconciler.reconcile_once(conn, now=now)
    assert result.asked == []
    assert any("sacct exited 1: Slurm accounting storage is disabled" in f for f in result.failed)
    assert any("gave no answer within 0.5 s" in f for f in result.failed), result.failed
    assert [j for _, j in result.lost] == [job]
    assert "Slurm gave no answer" in job_row(conn, job)["attrs"]["end_reason"]


def test_one_process_leads(fresh_url: str) -> None:
    settings = load_reconcile_settings(**NO_SLURM)
    first, second = Reconciler(fresh_url, settings), Reconciler(fresh_url, settings)
    assert first.tick() is not None
    assert second.tick() is None
    assert first._conn is not None
    first._conn.close()  # the leader's connection goes: the other takes over
    assert second.tick() is not None
    assert second._conn is not None
    second._conn.close()


def test_slurm_output_is_read_as_the_epilog_reads_it() -> None:
    # The fields reconciliation reads, in the shape of `squeue --json` on the test cluster (22.05): a
    # timed-out job, a pending array task, and a job whose *name* pretends to be job 4242, completed.
    answer = {"jobs": [
        {"job_id": 51, "name": "e2e", "job_state": "TIMEOUT", "state_reason": "TimeLimit", "exit_code": 15,
         "array_job_id": 0, "array_task_id": None, "het_job_id": 0, "start_time": 1795425352,
         "end_time": 1795425418},
        {"job_id": 60, "name": "a", "job_state": "PENDING", "exit_code": 0, "array_job_id": 58, "array_task_id": 2,
         "het_job_id": 0, "start_time": 0, "end_time": 0},
        {"job_id": 61, "name": "x JobId=4242 JobState=COMPLETED ExitCode=0:0", "job_state": "FAILED",
         "exit_code": 768, "array_job_id": 0, "array_task_id": None, "het_job_id": 0, "start_time": 1795425352,
         "end_time": 1795425353},
    ]}
    records = parse_squeue(json.dumps(answer))
    assert (records["51"].end_state, records["51"].exit_code, records["51"].end) == ("timeout", 143, 1795425418.0)
    assert records["58_2"].end_state is None and records["58_2"].start is None
    assert (records["61"].end_state, records["61"].exit_code) == ("failed", 3)
    assert "4242" not in records
    # Slurm 23.02 and later: states as lists, numbers as {set, infinite, number}, exit codes as objects.
    later = {"jobs": [{"job_id": {"set": True, "infinite": False, "number": 70}, "job_state": ["CANCELLED"],
                       "exit_code": {"status": ["SIGNALED"], "return_code": {"set": True, "number": 0},
                                     "signal": {"id": {"set": True, "number": 15}, "name": "TERM"}},
                       "array_job_id": {"set": True, "number": 0}, "array_task_id": {"set": False, "number": 0},
                       "het_job_id": {"set": True, "number": 0}, "start_time": {"set": True, "number": 1795425352},
                       "end_time": {"set": True, "number": 1795425362}}]}
    assert (parse_squeue(json.dumps(later))["70"].end_state, parse_squeue(json.dumps(later))["70"].exit_code) == (
        "cancelled", 143)
    sacct = "\n".join(["77|CANCELLED by 0|0:15|1795425352|1795425362", "78|FAILED|3:0|1795425352|1795425353",
                       "79+0|COMPLETED|0:0|1795425352|1795425360", "79+1|OUT_OF_MEMORY|0:125|1795425352|1795425361",
                       "80_[3-5]|PENDING|0:0|Unknown|Unknown"])
    got = {job: (r.end_state, r.exit_code) for job, r in parse_sacct(sacct).items()}
    assert got == {"77": ("cancelled", 143), "78": ("failed", 3), "79": ("out_of_memory", 253)}


def test_settings_from_env_and_toml_and_bad_values_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "jobsight.toml"
    config.write_text('[reconcile]\ngrace_s = 120\nclusters = ["della"]\ninterval_s = 30\n')
    monkeypatch.setenv("JOBSIGHT_CONFIG", str(config))
    monkeypatch.setenv("JOBSIGHT_RECONCILE_INTERVAL_S", "5")
    settings = load_reconcile_settings()
    assert (settings.interval_s, settings.grace_s, settings.clusters) == (5.0, 120.0, ["della"])
    monkeypatch.setenv("JOBSIGHT_RECONCILE_GRACE_S", "-1")
    with pytest.raises(SettingsError, match="JOBSIGHT_RECONCILE_GRACE_S"):
        load_reconcile_settings()


def test_sacct_ends_running_jobs_as_slurm_says_and_only_raises_ended_ones(
    conn: psycopg.Connection[dict[str, Any]], tmp_path: Path,
) -> None:
    """``sacct``'s answers (a site with slurmdbd; here a script printing what sacct prints, since the
    test cluster has no accounting) applied: a running job ends as Slurm says, at Slurm's end; one
    Slurm says still runs stays running however silent; a job id Slurm reused for a later job is not
    ended by that job's record; an ended job's state only moves up, and sacct is asked once about it."""
    now = time.time()
    t0 = int(now) - 1000
    ids = [str(800_000_000 + uuid.uuid4().int % 1_000_000 + i * 1_000_000) for i in range(5)]
    timed_out, still_runs, reused, was_completed, was_timeout = ids
    store(conn, [started(j, t0 * S, time_limit_s=60) for j in ids] + [gpu(j, (t0 + 50) * S) for j in ids])
    store(conn, [{"kind": "job_ended", "job": was_completed, "ts": int(now - 60) * S, "node": "n1", "exit_code": 0},
                 {"kind": "job_ended", "job": was_timeout, "ts": int(now - 60) * S, "node": "n1", "exit_code": 143,
                  "state": "TIMEOUT"}])
    calls = tmp_path / "calls"
    sacct = tmp_path / "sacct"
    sacct.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\ncat <<'EOF'\n"
                     f"{timed_out}|TIMEOUT|0:15|{t0}|{t0 + 65}\n"
                     f"{still_runs}|RUNNING|0:0|{t0}|Unknown\n"
                     f"{reused}|COMPLETED|0:0|{int(now) - 30}|{int(now) - 5}\n"
                     f"{was_completed}|OUT_OF_MEMORY|0:125|{t0}|{t0 + 55}\n"
                     f"{was_timeout}|COMPLETED|0:0|{t0}|{t0 + 55}\nEOF\n")
    sacct.chmod(0o755)
    reconciler = JobReconciler(load_reconcile_settings(grace_s=60, sacct=str(sacct),
                                                       squeue=NO_SLURM["squeue"]))
    result = reconciler.reconcile_once(conn, now=now)
    assert result.ended == {("default", timed_out): "timeout"}
    row = job_row(conn, timed_out)
    assert (row["state"], row["exit_code"], row["attrs"]["end_source"]) == ("timeout", 143, "sacct")
    assert row["end_time"] == dt.datetime.fromtimestamp(t0 + 65, dt.UTC)
    assert job_row(conn, still_runs)["state"] == "running"
    assert [j for _, j in result.lost] == [reused]
    assert "Slurm's job of that id started after this one went silent" in job_row(conn, reused)["attrs"]["end_reason"]
    row = job_row(conn, was_completed)
    assert (row["state"], row["exit_code"], row["attrs"]["end_source"]) == ("out_of_memory", 253, "sacct")
    assert job_row(conn, was_timeout)["state"] == "timeout"
    assert result.rechecked == {("default", was_completed): "out_of_memory", ("default", was_timeout): "timeout"}

    asked = calls.read_text().splitlines()
    assert reconciler.reconcile_once(conn, now=now + 1).rechecked == {}
    later = calls.read_text().splitlines()[len(asked):]
    assert all(was_completed not in line and was_timeout not in line for line in later), later
    assert any(still_runs in line for line in later)
