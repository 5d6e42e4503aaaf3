"""The actions pass on the real database: a ladder recorded step by step, a dry run that acts on
nothing, the hourly cap, a telemetry gap, and Slurm's commands called with the job and the reason;
only prolog-registered jobs with a Slurm job id are acted on, every id reaches Slurm after ``--``, and
the reason is added after the site's ``AdminComment``.

Slurm's ``scancel``/``scontrol``/``squeue`` are recording scripts here (as reconciliation's tests stand
in for ``sacct``); the real Slurm runs the same pass in tests/slurm."""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from jobsight.collector.config.actions import load_action_settings
from jobsight.collector.config.alerts import load_alert_settings
from jobsight.collector.passes.actions import Notify, WasteActions
from jobsight.collector.passes.slurm_jobs import (
    MAX_ADMIN_COMMENT,
    NotASlurmJobId,
    admin_comment_in,
    appended_comment,
    ask_sacct,
    cancel_job,
    read_admin_comment,
    requeue_job,
    write_admin_comment,
)
from jobsight.protocol.tokens import mint_job_token, mint_node_token
from jobsight.protocol.wire import encode_batch
from jobsight.rules.report_text import format_report
from tests.collector.helpers import SECRET, gz, next_seq, now_us, post

S = 1_000_000


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as c:
        yield c


COMMENTS = "admin_comments.json"
"""In the stand-ins' folder: the ``AdminComment`` the stand-in ``squeue --json`` gives each job."""
_SQUEUE = """#!{python}
import json, sys
from pathlib import Path
folder = Path(sys.argv[0]).parent
with open(folder / "calls", "a") as calls:
    calls.write("squeue " + " ".join(sys.argv[1:]) + "\\n")
comments = json.loads((folder / "{comments}").read_text()) if (folder / "{comments}").exists() else {{}}
asked = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--jobs=")]
# As Slurm 22.05 does: the job asked for and every other job it remembers (a null comment: it forgot the job).
jobs = {{job: "" for job in asked}} | comments
print(json.dumps({{"jobs": [{{"job_id": int(job), "job_state": "RUNNING", "admin_comment": text}}
                           for job, text in jobs.items() if text is not None]}}))
"""


@pytest.fixture
def slurm(tmp_path: Path) -> tuple[Path, Path]:
    """Stand-ins for scancel and scontrol that append their arguments to a file, one line a call, and a
    ``squeue --json`` that also answers with the ``AdminComment`` of each job in :data:`COMMENTS`."""
    calls = tmp_path / "calls"
    script = tmp_path / "slurm-command"
    script.write_text(f'#!/bin/sh\necho "$(basename "$0") $*" >> {calls}\n')
    script.chmod(0o755)
    for name in ("scancel", "scontrol"):
        (tmp_path / name).symlink_to(script)
    squeue = tmp_path / "squeue"
    squeue.write_text(_SQUEUE.format(python=sys.executable, comments=COMMENTS))
    squeue.chmod(0o755)
    return tmp_path, calls


def site_comments(folder: Path, comments: dict[str, str | None]) -> None:
    """What the site keeps in these jobs' ``AdminComment`` (``""``: nothing; ``None``: squeue's answer lacks
    the job); squeue answers for any other job asked with an empty one."""
    (folder / COMMENTS).write_text(json.dumps(comments))


def slurm_id() -> str:
    """A Slurm job id of its own (the shared database holds other tests' jobs)."""
    return str(1_000_000_000 + uuid.uuid4().int % 8_999_999_999)


def idle_job(client: Any, conn: psycopg.Connection[dict[str, Any]], idle_minutes: float, *,
             account: str = "ml", sample_age_s: float = 20, time_limit_s: int | None = 86400,
             evidence: dict[str, Any] | None = None) -> str:
    """A running job a prolog registered, with a GPU sample ``sample_age_s`` ago and an idle finding
    opened ``idle_minutes`` ago (with ``evidence``)."""
    job = slurm_id()
    t = now_us()
    records = [{"kind": "job_started", "job": job, "ts": t - 3600 * S, "node": "n1", "user": "alice",
                "account": account, "partition": "gpu", "nodes": ["n1"], "gpus": ["0"],
                "time_limit_s": time_limit_s},
               {"kind": "gpu_sample", "job": job, "ts": t - int(sample_age_s * S), "node": "n1", "gpu_index": 0,
                "gpu_uuid": "GPU-0", "util_gpu": 0.0, "mem_used": 1, "mem_total": 80}]
    assert post(client, gz(records)).status_code == 200
    open_finding(conn, job, idle_minutes, evidence or {"util": 0})
    return job


def open_finding(conn: psycopg.Connection[dict[str, Any]], job: str, idle_minutes: float,
                 evidence: dict[str, Any]) -> None:
    conn.execute("""INSERT INTO findings (cluster, job_id, rule, severity, opened_at, updated_at, title, message,
                                          evidence)
                    VALUES ('default', %s, 'idle_allocation', 'warning', now() - %s, now(), 'idle', 'idle', %s)""",
                 (job, dt.timedelta(minutes=idle_minutes), Jsonb(evidence)))


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
                                scontrol=str(folder / "scontrol"), squeue=str(folder / "squeue"),
                                max_actions_per_hour=1000, clusters=["default"],
                                accounts_enforced="accounts" in policy or "exempt_accounts" in policy)


def test_the_ladder_warns_twice_then_cancels_with_the_reason(client: Any, conn: psycopg.Connection[dict[str, Any]],
                                                              slurm: tuple[Path, Path]) -> None:
    folder, calls = slurm
    job = idle_job(client, conn, idle_minutes=200)
    actions = WasteActions(settings(folder))
    for _ in range(4):
        actions.act_once(conn)
    assert steps(conn, job) == [("warn", "recorded", False), ("warn_again", "recorded", False), ("act", "done", False)]
    reason = "jobsight: GPUs idle 3.3 h (policy gpu-idle)"
    assert calls_for(calls, job) == [f"squeue --json --states=all --jobs={job}",
                                     f"scontrol -- update JobId={job} AdminComment={reason}", f"scancel -- {job}"]


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
    assert calls_for(calls, job)[-1] == f"scancel -- {job}"


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
    assert sum(1 for job in jobs for line in calls_for(calls, job) if line.startswith("scancel -- ")) == 5


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
    job = idle_job(client, conn, idle_minutes=200, time_limit_s=4 * 3600)
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


@pytest.mark.parametrize("time_limit_s", [9 * 3600, None])
def test_a_job_without_a_batch_script_is_not_exempt_past_the_time_limit_cap(
    client: Any, conn: psycopg.Connection[dict[str, Any]], slurm: tuple[Path, Path], time_limit_s: int | None,
) -> None:
    """``salloc --no-shell`` then ``srun`` is any user's batch job without a script: with a time limit past
    the cap (8 h by default) or none, it is warned and cancelled like any other."""
    folder, calls = slurm
    job = idle_job(client, conn, idle_minutes=200, time_limit_s=time_limit_s)
    conn.execute("UPDATE jobs SET batch = false, time_limit_s = %s WHERE job_id = %s", (time_limit_s, job))
    actions = WasteActions(settings(folder))
    for _ in range(3):
        actions.act_once(conn)
    assert steps(conn, job) == [("warn", "recorded", False), ("warn_again", "recorded", False), ("act", "done", False)]
    assert calls_for(calls, job)[-1] == f"scancel -- {job}"


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
    job = slurm_id()
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
    far = slurm_id()
    conn.execute("""INSERT INTO jobs (cluster, job_id, user_name, nodes, state)
                    VALUES ('far', %s, 'mallory', '{n1}', 'running')""", (far,))
    _fresh_sample(conn, "far", far)
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
        assert calls_for(calls, far) == [] and calls_for(calls, here)[-1] == f"scancel -- {here}"
        # A site whose Slurm runs both clusters lists both: the pass no longer refuses.
        caplog.clear()
        WasteActions(settings(folder).model_copy(update={"clusters": ["default", "far"]})).act_once(conn)
        assert "acting on none" not in caplog.text
        WasteActions(settings(folder).model_copy(update={"clusters": []})).act_once(conn)
        assert "acting on none" in caplog.text
    finally:
        conn.execute("UPDATE findings SET state = 'resolved', resolved_at = now() WHERE job_id = %s", (far,))


def _fresh_sample(conn: psycopg.Connection[dict[str, Any]], cluster: str, job: str) -> None:
    """A node's 0 % minute for ``job`` written straight into the table, as a corrupted table would hold
    it (the wire refuses such a job id): fresh for the whole test, so only the id can hold the job back."""
    conn.execute("""INSERT INTO gpu_minutes (cluster, job_id, ts, node, gpu_index, gpu_uuid, samples, util_gpu_sum,
                        util_gpu_n, util_idle_n, util_mem_sum, util_mem_n, power_sum, power_n, temp_sum, temp_n,
                        energy_n, first_ts, last_ts, lost)
                    VALUES (%s, %s, date_trunc('minute', now()), 'n1', 0, 'GPU-0', 1, 0, 1, 1, 0, 1, 0, 0, 0, 0, 0,
                            now(), now() + interval '10 minutes', false)""", (cluster, job))


def test_a_job_id_that_is_not_slurms_reaches_no_command_and_gets_no_step(
    conn: psycopg.Connection[dict[str, Any]], slurm: tuple[Path, Path], caplog: pytest.LogCaptureFixture,
) -> None:
    """A corrupted jobs row registered under ``--user=alice``, idle for hours with fresh samples: the old
    pass ran ``scontrol update JobId=--user=alice`` and ``scancel --user=alice`` (every job of alice's)."""
    folder, calls = slurm
    hostile = f"--user=alice-{uuid.uuid4().hex[:6]}"
    conn.execute("""INSERT INTO jobs (cluster, job_id, user_name, nodes, state, batch, time_limit_s)
                    VALUES ('default', %s, 'alice', '{n1}', 'running', true, 86400)""", (hostile,))
    _fresh_sample(conn, "default", hostile)
    open_finding(conn, hostile, 200, {"util": 0})
    try:
        actions = WasteActions(settings(folder))
        for _ in range(4):
            actions.act_once(conn)
        assert steps(conn, hostile) == []
        lines = calls.read_text().splitlines() if calls.exists() else []
        assert not [line for line in lines if "--user" in line], lines
        assert "is not a Slurm job id: no policy acts on it" in caplog.text
    finally:
        conn.execute("UPDATE findings SET state = 'resolved', resolved_at = now() WHERE job_id = %s", (hostile,))
        conn.execute("UPDATE jobs SET state = 'lost', end_time = now() WHERE job_id = %s", (hostile,))


def test_a_job_no_prolog_registered_is_not_acted_on(conn: psycopg.Connection[dict[str, Any]],
                                                    slurm: tuple[Path, Path]) -> None:
    """A Slurm-looking id known only from samples (no user, no allocation: no prolog said it is a job
    of this cluster's Slurm) is never a candidate, however idle."""
    folder, calls = slurm
    job = slurm_id()
    conn.execute("INSERT INTO jobs (cluster, job_id, nodes, state) VALUES ('default', %s, '{n1}', 'running')", (job,))
    _fresh_sample(conn, "default", job)
    open_finding(conn, job, 200, {"util": 0})
    try:
        actions = WasteActions(settings(folder))
        for _ in range(4):
            actions.act_once(conn)
        assert steps(conn, job) == [] and calls_for(calls, job) == []
    finally:
        conn.execute("UPDATE findings SET state = 'resolved', resolved_at = now() WHERE job_id = %s", (job,))


@pytest.mark.parametrize("job", ["--user=alice", "-1", "1234 5678", "1234,5678", "", "local-n1-42-1", "12_3_4"])
def test_every_slurm_command_refuses_an_id_that_is_not_slurms_and_runs_nothing(
    job: str, slurm: tuple[Path, Path],
) -> None:
    folder, calls = slurm
    commands = [lambda: cancel_job(str(folder / "scancel"), job, 5),
                lambda: requeue_job(str(folder / "scontrol"), job, 5),
                lambda: write_admin_comment(str(folder / "scontrol"), job, "jobsight: x", 5),
                lambda: read_admin_comment(str(folder / "squeue"), job, 5),
                lambda: ask_sacct(str(folder / "scancel"), ["1234", job], 5)]
    for command in commands:
        with pytest.raises(NotASlurmJobId):
            command()
    assert not calls.exists()


def test_slurm_ids_are_passed_after_a_double_dash_or_inside_one_argument(slurm: tuple[Path, Path]) -> None:
    folder, calls = slurm
    cancel_job(str(folder / "scancel"), "1234_7", 5)
    requeue_job(str(folder / "scontrol"), "1234+1", 5)
    write_admin_comment(str(folder / "scontrol"), "1234", "site; jobsight: x", 5)
    ask_sacct(str(folder / "scancel"), ["1234", "1235_2"], 5)  # the recorder prints nothing: no records
    assert calls.read_text().splitlines() == [
        "scancel -- 1234_7", "scontrol -- requeue 1234+1",
        "scontrol -- update JobId=1234 AdminComment=site; jobsight: x",
        "scancel --noheader --parsable2 --allocations -o JobID,State,ExitCode,Start,End --jobs=1234,1235_2"]


@pytest.mark.parametrize(("theirs", "written"), [
    ("site: keep", "site: keep; {reason}"),
    ("", "{reason}"),
    ("site: keep; {reason}", None),  # a retried step: the reason is there already
    ("x" * MAX_ADMIN_COMMENT, None),  # no room: the site's text is never cut
])
def test_the_reason_is_added_after_the_sites_admin_comment(
    client: Any, conn: psycopg.Connection[dict[str, Any]], slurm: tuple[Path, Path], theirs: str,
    written: str | None,
) -> None:
    folder, calls = slurm
    job = idle_job(client, conn, idle_minutes=200)
    reason = "jobsight: GPUs idle 3.3 h (policy gpu-idle)"
    site_comments(folder, {job: theirs.format(reason=reason)})
    actions = WasteActions(settings(folder))
    for _ in range(3):
        actions.act_once(conn)
    updates = [line for line in calls_for(calls, job) if line.startswith("scontrol -- update")]
    comment = None if written is None else written.format(reason=reason)
    expected = [] if comment is None else [f"scontrol -- update JobId={job} AdminComment={comment}"]
    assert updates == expected
    assert calls_for(calls, job)[-1] == f"scancel -- {job}" and steps(conn, job)[-1] == ("act", "done", False)


def test_an_admin_comment_slurm_does_not_answer_for_is_left_alone_and_the_job_still_cancelled(
    client: Any, conn: psycopg.Connection[dict[str, Any]], slurm: tuple[Path, Path],
) -> None:
    """squeue's answer lacks the job: what the site keeps there is unknown, so nothing is written over it."""
    folder, calls = slurm
    job = idle_job(client, conn, idle_minutes=200)
    site_comments(folder, {job: None, slurm_id(): "another job's"})
    actions = WasteActions(settings(folder))
    for _ in range(3):
        actions.act_once(conn)
    assert calls_for(calls, job) == [f"squeue --json --states=all --jobs={job}", f"scancel -- {job}"]


def test_admin_comment_is_read_from_slurms_json_by_the_id_users_see() -> None:
    answer = json.dumps({"jobs": [
        {"job_id": 41, "admin_comment": "not this one"},
        {"job_id": 77, "array_job_id": 70, "array_task_id": 7, "admin_comment": "task 7"},
        {"job_id": 81, "het_job_id": 80, "admin_comment": "component"},
        {"job_id": 80, "het_job_id": 80, "admin_comment": "leader"},
        {"job_id": 90, "admin_comment": None}]})
    assert [admin_comment_in(answer, job) for job in ("70_7", "80", "90")] == ["task 7", "leader", ""]
    assert appended_comment("  ", "ours") == "ours"


def test_the_reason_and_the_warning_count_idle_time_from_when_the_gpus_went_idle(
    client: Any, conn: psycopg.Connection[dict[str, Any]], slurm: tuple[Path, Path],
) -> None:
    """The finding opened 200 min ago, after 30 min of idle GPUs (its evidence's ``idle_since``): the
    warning says 3.8 h and so does the reason Slurm shows, not the finding's 3.3 h."""
    folder, calls = slurm
    since = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=230)).timestamp()
    job = idle_job(client, conn, idle_minutes=200, evidence={"util": 0, "idle_since": since})
    alerts = load_alert_settings(user_address_template="mailto://127.0.0.1:25?from=hpc@example.org&to={user}@example.org")
    actions = WasteActions(settings(folder), Notify(alerts))
    for _ in range(3):
        actions.act_once(conn)
    reason = "jobsight: GPUs idle 3.8 h (policy gpu-idle)"
    assert conn.execute("SELECT detail FROM actions WHERE job_id = %s AND step = 'act'", (job,)).fetchone() == {
        "detail": reason}
    assert f"scontrol -- update JobId={job} AdminComment={reason}" in calls_for(calls, job)
    titles = [r["title"] for r in conn.execute("SELECT title FROM notices WHERE job_id = %s ORDER BY id", (job,))]
    assert titles[:2] == [f"jobsight: job {job}: GPUs idle 3.8 h (first warning)",
                          f"jobsight: job {job}: GPUs idle 3.8 h (second warning)"], titles
