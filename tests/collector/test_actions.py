"""The actions pass on the real database: a ladder recorded step by step, a dry run that acts on
nothing, the hourly cap, a telemetry gap, and Slurm's commands called with the job and the reason.

Slurm's ``scancel``/``scontrol`` are a recording script here (as reconciliation's tests stand in for
``sacct``); the real Slurm runs the same pass in tests/slurm."""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from jobsight.collector.config.actions import load_action_settings
from jobsight.collector.passes.actions import WasteActions
from jobsight.protocol.report_text import format_report
from jobsight.protocol.tokens import mint_job_token, mint_node_token
from jobsight.protocol.wire import encode_batch
from tests.collector.helpers import SECRET, gz, next_seq, now_us, post

S = 1_000_000


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as c:
        yield c


@pytest.fixture
def slurm(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in for scancel and scontrol that appends its arguments to a file, one line a call."""
    calls = tmp_path / "calls"
    script = tmp_path / "slurm-command"
    script.write_text(f'#!/bin/sh\necho "$(basename "$0") $*" >> {calls}\n')
    script.chmod(0o755)
    for name in ("scancel", "scontrol"):
        (tmp_path / name).symlink_to(script)
    return tmp_path, calls


def idle_job(client: Any, conn: psycopg.Connection[dict[str, Any]], idle_minutes: float, *,
             account: str = "ml", sample_age_s: float = 20) -> str:
    """A running job with a GPU sample ``sample_age_s`` ago and an idle finding opened ``idle_minutes`` ago."""
    job = f"act-{uuid.uuid4().hex[:10]}"
    t = now_us()
    records = [{"kind": "job_started", "job": job, "ts": t - 3600 * S, "node": "n1", "user": "alice",
                "account": account, "partition": "gpu", "nodes": ["n1"], "gpus": ["0"]},
               {"kind": "gpu_sample", "job": job, "ts": t - int(sample_age_s * S), "node": "n1", "gpu_index": 0,
                "gpu_uuid": "GPU-0", "util_gpu": 0.0, "mem_used": 1, "mem_total": 80}]
    assert post(client, gz(records)).status_code == 200
    conn.execute("""INSERT INTO findings (cluster, job_id, rule, severity, opened_at, updated_at, title, message,
                                          evidence)
                    VALUES ('default', %s, 'idle_allocation', 'warning', now() - %s, now(), 'idle', 'idle', %s)""",
                 (job, dt.timedelta(minutes=idle_minutes), Jsonb({"util": 0})))
    return job


def calls_for(calls: Path, job: str) -> list[str]:
    """The recorded commands naming ``job`` (the shared database holds other tests' idle jobs too)."""
    lines = calls.read_text().splitlines() if calls.exists() else []
    return [line for line in lines if re.search(rf"(^|[ =]){re.escape(job)}( |$)", line)]


def steps(conn: psycopg.Connection[dict[str, Any]], job: str) -> list[tuple[str, str, bool]]:
    return [(r["step"], r["outcome"], r["dry_run"]) for r in conn.execute(
        "SELECT step, outcome, dry_run FROM actions WHERE job_id = %s ORDER BY id", (job,)).fetchall()]


def settings(folder: Path, **policy: Any) -> Any:
    base = {"name": "gpu-idle", "rule": "idle_allocation", "warn_after_s": 60, "warn_again_after_s": 120,
            "act_after_s": 180, "action": "cancel", "dry_run": False}
    # clusters named: other tests' running jobs of other clusters share this database.
    return load_action_settings(policies=[{**base, **policy}], scancel=str(folder / "scancel"),
                                scontrol=str(folder / "scontrol"), max_actions_per_hour=1000, clusters=["default"])


def test_the_ladder_warns_twice_then_cancels_with_the_reason(client: Any, conn: psycopg.Connection[dict[str, Any]],
                                                              slurm: tuple[Path, Path]) -> None:
    folder, calls = slurm
    job = idle_job(client, conn, idle_minutes=200)
    actions = WasteActions(settings(folder))
    for _ in range(4):
        actions.act_once(conn)
    assert steps(conn, job) == [("warn", "recorded", False), ("warn_again", "recorded", False), ("act", "done", False)]
    reason = "jobsight: GPUs idle 3.3 h (policy gpu-idle)"
    assert calls_for(calls, job) == [f"scontrol update JobId={job} AdminComment={reason}", f"scancel {job}"]


def test_a_dry_run_records_the_ladder_and_runs_nothing(client: Any, conn: psycopg.Connection[dict[str, Any]],
                                                       slurm: tuple[Path, Path]) -> None:
    folder, calls = slurm
    job = idle_job(client, conn, idle_minutes=200)
    actions = WasteActions(settings(folder, dry_run=True))
    for _ in range(4):
        actions.act_once(conn)
    assert steps(conn, job) == [("warn", "recorded", True), ("warn_again", "recorded", True), ("act", "recorded", True)]
    assert calls_for(calls, job) == []


def test_a_silent_job_is_not_acted_on(client: Any, conn: psycopg.Connection[dict[str, Any]],
                                      slurm: tuple[Path, Path]) -> None:
    folder, calls = slurm
    job = idle_job(client, conn, idle_minutes=200, sample_age_s=600)
    WasteActions(settings(folder)).act_once(conn)
    assert steps(conn, job) == [] and calls_for(calls, job) == []


def test_an_exempt_account_is_recorded_once_and_never_warned(client: Any, conn: psycopg.Connection[dict[str, Any]],
                                                              slurm: tuple[Path, Path]) -> None:
    folder, calls = slurm
    job = idle_job(client, conn, idle_minutes=200, account="ood")
    actions = WasteActions(settings(folder, exempt_accounts=["ood"]))
    for _ in range(3):
        actions.act_once(conn)
    assert steps(conn, job) == [("exempt", "recorded", False)] and calls_for(calls, job) == []


def test_past_the_cap_an_action_is_held_back_and_taken_later(client: Any, conn: psycopg.Connection[dict[str, Any]],
                                                              slurm: tuple[Path, Path]) -> None:
    folder, calls = slurm
    job = idle_job(client, conn, idle_minutes=200)
    conn.execute("UPDATE actions SET at = now() - interval '2 hours' WHERE step = 'act'")  # earlier tests' acts
    capped = WasteActions(settings(folder).model_copy(update={"max_actions_per_hour": 0}))
    for _ in range(3):
        capped.act_once(conn)
    assert steps(conn, job)[-1] == ("act", "held_back", False) and calls_for(calls, job) == []
    WasteActions(settings(folder)).act_once(conn)
    assert steps(conn, job)[-1] == ("act", "done", False)
    assert calls_for(calls, job)[-1] == f"scancel {job}"


def test_twenty_idle_jobs_and_a_cap_of_five_cancel_five_and_hold_back_the_rest(
    client: Any, conn: psycopg.Connection[dict[str, Any]], slurm: tuple[Path, Path],
) -> None:
    folder, calls = slurm
    conn.execute("UPDATE actions SET at = now() - interval '2 hours' WHERE step = 'act'")  # earlier tests' acts
    jobs = [idle_job(client, conn, idle_minutes=200) for _ in range(20)]
    capped = WasteActions(settings(folder).model_copy(update={"max_actions_per_hour": 5}))
    for _ in range(3):
        capped.act_once(conn)
    last = [steps(conn, job)[-1] for job in jobs]
    assert last.count(("act", "done", False)) == 5 and last.count(("act", "held_back", False)) == 15
    assert sum(1 for job in jobs for line in calls_for(calls, job) if line.startswith("scancel")) == 5


def test_the_api_shows_a_job_its_steps_and_admins_every_job(client: Any, conn: psycopg.Connection[dict[str, Any]],
                                                            slurm: tuple[Path, Path]) -> None:
    folder, _ = slurm
    job = idle_job(client, conn, idle_minutes=200)
    WasteActions(settings(folder, dry_run=True)).act_once(conn)
    mine = client.get(f"/v1/jobs/{job}/actions").json()["actions"]
    assert [(a["policy"], a["step"], a["dry_run"]) for a in mine] == [("gpu-idle", "warn", True)]
    everyone = client.get("/v1/actions", params={"user": "alice", "step": "warn"}).json()
    assert job in {a["job_id"] for a in everyone["actions"]} and everyone["total"] >= 1
    assert client.get("/v1/actions", params={"step": "delete"}).status_code == 422


def test_an_interactive_job_is_exempt_by_slurms_batch_flag(client: Any, conn: psycopg.Connection[dict[str, Any]],
                                                           slurm: tuple[Path, Path]) -> None:
    folder, calls = slurm
    job = idle_job(client, conn, idle_minutes=200)
    facts = {"kind": "job_started", "job": job, "ts": now_us(), "node": "n1", "batch": False, "qos": "normal",
             "comment": "salloc session"}
    assert post(client, gz([facts])).status_code == 200
    row = conn.execute("SELECT batch, qos, comment FROM jobs WHERE job_id = %s", (job,)).fetchone()
    assert row == {"batch": False, "qos": "normal", "comment": "salloc session"}
    actions = WasteActions(settings(folder))
    for _ in range(3):
        actions.act_once(conn)
    assert steps(conn, job) == [("exempt", "recorded", False)] and calls_for(calls, job) == []
    detail = conn.execute("SELECT detail FROM actions WHERE job_id = %s", (job,)).fetchone()
    assert detail == {"detail": "interactive (no batch script)"}


def test_the_reason_is_on_the_job_in_the_api_and_in_jobsight_report(
    client: Any, conn: psycopg.Connection[dict[str, Any]], slurm: tuple[Path, Path], admin_token: str,
) -> None:
    folder, _ = slurm
    job = idle_job(client, conn, idle_minutes=200)
    actions = WasteActions(settings(folder))
    for _ in range(3):
        actions.act_once(conn)
    reason = "jobsight: GPUs idle 3.3 h (policy gpu-idle)"
    answer = client.get(f"/v1/jobs/{job}", headers={"Authorization": f"Bearer {admin_token}"})
    assert answer.status_code == 200 and answer.json()["end_reason"] == reason
    # Slurm's end state stays Slurm's: the epilog says CANCELLED, the reason stands beside it.
    ended = [{"kind": "job_ended", "job": job, "ts": now_us(), "node": "n1", "state": "CANCELLED", "exit_code": 0}]
    assert post(client, gz(ended)).status_code == 200
    row = client.get(f"/v1/jobs/{job}", headers={"Authorization": f"Bearer {admin_token}"}).json()
    assert row["state"] == "cancelled" and row["end_reason"] == reason
    text = format_report(row, {"final": True, "summary": {}})
    assert "State: CANCELLED" in text and f"Reason: {reason}" in text


def test_a_job_s_own_fresh_samples_do_not_make_a_telemetry_gap_look_like_data(
    secret_client: Any, conn: psycopg.Connection[dict[str, Any]], slurm: tuple[Path, Path],
) -> None:
    """The node daemon's last sample is 10 minutes old; the job's own token keeps sending 0 % samples
    (self-reported: kept as metrics, never counted as the node's). No step: a gap is not idleness."""
    folder, calls = slurm
    job = f"self-{uuid.uuid4().hex[:10]}"
    node = {"Authorization": f"Bearer {mint_node_token(SECRET, 'default', 'n1')}"}
    own = {"Authorization": f"Bearer {mint_job_token(SECRET, 'default', job, 3600, uid=1001)}"}
    t = now_us()
    started = {"kind": "job_started", "job": job, "ts": t - 3600 * S, "node": "n1", "user": "alice", "uid": 1001,
               "account": "ml", "partition": "gpu", "nodes": ["n1"], "gpus": ["0"]}
    sample = {"kind": "gpu_sample", "job": job, "node": "n1", "gpu_index": 0, "gpu_uuid": "GPU-0", "util_gpu": 0.0,
              "mem_used": 1, "mem_total": 80}
    assert post(secret_client, encode_batch("prolog", next_seq(), [started]), **node).status_code == 200
    assert post(secret_client, encode_batch("daemon", next_seq(), [{**sample, "ts": t - 600 * S}]),
                **node).status_code == 200
    assert post(secret_client, encode_batch("job", next_seq(), [{**sample, "ts": t - S}]), **own).status_code == 200
    conn.execute("""INSERT INTO findings (cluster, job_id, rule, severity, opened_at, updated_at, title, message,
                                          evidence)
                    VALUES ('default', %s, 'idle_allocation', 'warning', now() - interval '200 minutes', now(),
                            'idle', 'idle', '{}')""", (job,))
    actions = WasteActions(settings(folder))
    for _ in range(3):
        actions.act_once(conn)
    assert steps(conn, job) == [] and calls_for(calls, job) == []


def test_jobs_of_another_cluster_are_never_cancelled_by_this_hosts_slurm(
    client: Any, conn: psycopg.Connection[dict[str, Any]], slurm: tuple[Path, Path], caplog: pytest.LogCaptureFixture,
) -> None:
    """scancel takes a job number, and each cluster has its own: job N of cluster "far" is not this
    Slurm's job N. Unset ``clusters`` with two clusters' idle jobs: nothing is done; set: only its own."""
    folder, calls = slurm
    here = idle_job(client, conn, idle_minutes=200)
    far = f"far-{uuid.uuid4().hex[:10]}"
    conn.execute("INSERT INTO jobs (cluster, job_id, user_name, state) VALUES ('far', %s, 'mallory', 'running')",
                 (far,))
    conn.execute("""INSERT INTO findings (cluster, job_id, rule, severity, opened_at, updated_at, title, message,
                                          evidence)
                    VALUES ('far', %s, 'idle_allocation', 'warning', now() - interval '200 minutes', now(), 'idle',
                            'idle', '{}')""", (far,))
    try:
        unset = WasteActions(settings(folder).model_copy(update={"clusters": []}))
        assert unset.act_once(conn).steps == []
        assert steps(conn, here) == [] and steps(conn, far) == []
        own = WasteActions(settings(folder))
        for _ in range(3):
            own.act_once(conn)
        assert [s for s, *_ in steps(conn, here)] == ["warn", "warn_again", "act"] and steps(conn, far) == []
        assert calls_for(calls, far) == [] and calls_for(calls, here)[-1] == f"scancel {here}"
        # A site whose Slurm runs both clusters lists both: the pass no longer refuses.
        caplog.clear()
        WasteActions(settings(folder).model_copy(update={"clusters": ["default", "far"]})).act_once(conn)
        assert "acting on none" not in caplog.text
        WasteActions(settings(folder).model_copy(update={"clusters": []})).act_once(conn)
        assert "acting on none" in caplog.text
    finally:
        conn.execute("UPDATE findings SET state = 'resolved', resolved_at = now() WHERE job_id = %s", (far,))
