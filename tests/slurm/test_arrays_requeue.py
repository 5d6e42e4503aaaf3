"""Job arrays, heterogeneous jobs and requeues (issue #15, part 3).

* Without Slurm: the id every hook derives from Slurm's environment (agent/slurm/job.py
  ``job_id_from_env``) and the task prolog's ``JOBSIGHT_JOB_ID``.
* On the real test cluster (tests/slurm/test_e2e.py's ``cluster`` fixture: hooks, node daemon on
  the fake NVML, a live collector): an array of 3 tasks is 3 jobs ``N_0``, ``N_1``, ``N_2``, and
  ``scontrol requeue`` gives 2 runs, kept apart (collector/jobs/job_runs.py). A heterogeneous job is not
  run here: on the one-node test cluster its second component never starts (both components pend
  on Resources with the node idle), so only the id derivation is tested.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.spool import Spool
from jobsight.agent.slurm.hooks import HookSettings, run_hook, task_prolog_lines
from jobsight.protocol.slurm_ids import job_id_from_env
from jobsight.protocol.tokens import verify_token
from tests.slurm.slurm_commands import SBATCH, SCONTROL
from tests.slurm.squeue_stub import squeue_stub
from tests.slurm.test_e2e import E2E_DIR, Cluster, cluster, job_state  # noqa: F401 (the fixture)

# -- the id, without Slurm ------------------------------------------------------------

# What slurmd gives the prolog of array task 7 of array 1234 (its own job id is 1241).
ARRAY_TASK = {"SLURM_JOB_ID": "1241", "SLURM_ARRAY_JOB_ID": "1234", "SLURM_ARRAY_TASK_ID": "7",
              "SLURM_JOB_RESTART_COUNT": "0"}


def test_an_array_task_is_named_as_users_see_it() -> None:
    assert job_id_from_env(ARRAY_TASK) == "1234_7"
    # The array's first task has SLURM_JOB_ID == SLURM_ARRAY_JOB_ID: still the task's id.
    assert job_id_from_env({"SLURM_JOB_ID": "1234", "SLURM_ARRAY_JOB_ID": "1234", "SLURM_ARRAY_TASK_ID": "0"}) == (
        "1234_0")


def test_a_heterogeneous_jobs_components_are_one_job() -> None:
    leader = {"SLURM_JOB_ID": "500", "SLURM_HET_JOB_ID": "500", "SLURM_HET_JOB_OFFSET": "0"}
    component = {"SLURM_JOB_ID": "501", "SLURM_HET_JOB_ID": "500", "SLURM_HET_JOB_OFFSET": "1"}
    assert job_id_from_env(leader) == job_id_from_env(component) == "500"


def test_a_plain_job_keeps_its_id_and_bad_ids_are_refused() -> None:
    assert job_id_from_env({"SLURM_JOB_ID": "42"}) == "42"
    assert job_id_from_env({"SLURM_JOBID": "42"}) == "42"
    # Half an array's variables is not an array task.
    assert job_id_from_env({"SLURM_JOB_ID": "42", "SLURM_ARRAY_TASK_ID": "3"}) == "42"
    with pytest.raises(ValueError):
        job_id_from_env({"SLURM_JOB_ID": "../etc"})
    with pytest.raises(ValueError):
        job_id_from_env({})


def test_the_task_prolog_exports_the_array_tasks_id_and_its_token(tmp_path: Path) -> None:
    (tmp_path / "1234_7.token").write_text("token-of-1234_7\n")
    hooks = HookSettings(token_dir=str(tmp_path))
    lines = task_prolog_lines({**ARRAY_TASK, "SLURM_SCRIPT_CONTEXT": "prolog_task"}, AgentSettings(), hooks)
    assert "export JOBSIGHT_JOB_ID=1234_7" in lines
    assert "export JOBSIGHT_TOKEN=token-of-1234_7" in lines


def test_prolog_task_prolog_and_epilog_agree_on_an_array_tasks_id(tmp_path: Path) -> None:
    """slurmd gives the prolog and epilog no SLURM_ARRAY_* (22.05): they learn the task's id from
    ``squeue --json`` (a stub printing what Slurm prints for a running task), the task prolog
    from its environment, and all three name the files and records alike."""
    squeue = squeue_stub(tmp_path, {"array_job_id": 1234, "array_task_id": 7, "name": "arr", "user_id": 0,
                                    "time_limit": 10})
    secret = tmp_path / "secret"
    secret.write_text("arrays-test-secret-0123456789abcdef\n")
    secret.chmod(0o600)
    env = {"SLURM_JOB_ID": "1241", "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_USER": "root",
           "SLURM_NODELIST": "n1", "SLURMD_NODENAME": "n1", "SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_GPUS": "0",
           "JOBSIGHT_URL": "http://127.0.0.1:1", "JOBSIGHT_SQUEUE": squeue,
           "JOBSIGHT_SECRET_FILE": str(secret), "JOBSIGHT_TOKEN_DIR": str(tmp_path / "tokens"),
           "JOBSIGHT_REGISTRATION_DIR": str(tmp_path / "jobs"), "JOBSIGHT_SPOOL_DIR": str(tmp_path / "spool"),
           "JOBSIGHT_HOOK_LOG": str(tmp_path / "hooks.log")}
    assert run_hook("prolog", env) == 0
    assert (tmp_path / "tokens" / "1234_7.token").exists() and (tmp_path / "jobs" / "1234_7.json").exists()
    assert not (tmp_path / "tokens" / "1241.token").exists()
    task_env = {**env, "SLURM_ARRAY_JOB_ID": "1234", "SLURM_ARRAY_TASK_ID": "7"}
    lines = task_prolog_lines(task_env, AgentSettings(), HookSettings(token_dir=str(tmp_path / "tokens")))
    assert "export JOBSIGHT_JOB_ID=1234_7" in lines
    token = next(line.split("=", 1)[1] for line in lines if line.startswith("export JOBSIGHT_TOKEN="))
    assert verify_token("arrays-test-secret-0123456789abcdef", token).job == "1234_7"
    assert run_hook("epilog", env) == 0
    assert not (tmp_path / "tokens" / "1234_7.token").exists() and not (tmp_path / "jobs" / "1234_7.json").exists()
    # What they could not post waits in the spool: every record under the task's id.
    spool = Spool(str(tmp_path / "spool"), 2**30)
    spool.adopt()
    jobs = []
    while (batch := spool.peek()) is not None:
        jobs += [r["job"] for r in json.loads(gzip.decompress(batch.body))["records"]]
        spool.ack()
    assert jobs == ["1234_7", "1234_7"]  # job_started, job_ended


# -- on the real cluster --------------------------------------------------------------

STATE_TIMEOUT_S = 60.0


def _sbatch(*args: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(E2E_DIR / "home"), "LANG": "C.UTF-8"}
    result = subprocess.run([SBATCH, "--parsable", "-D", str(E2E_DIR / "work"), *args],
                            env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]


def _scontrol(*args: str) -> str:
    result = subprocess.run([SCONTROL, *args], capture_output=True, text=True, timeout=10)
    assert result.returncode == 0, f"scontrol {' '.join(args)}: {result.stderr}"
    return result.stdout


def _wait_state(job: str, wanted: tuple[str, ...]) -> str:
    deadline = time.monotonic() + STATE_TIMEOUT_S
    state = ""
    while time.monotonic() < deadline:
        state = job_state(job)[0]
        if state in wanted:
            return state
        time.sleep(0.3)
    raise AssertionError(f"job {job}: {state}, not {wanted} after {STATE_TIMEOUT_S:.0f} s")


PRINT_IDS = "env | grep -E '^(JOBSIGHT_JOB_ID|JOBSIGHT_TOKEN|SLURM_JOB_ID|SLURM_RESTART_COUNT)=' | sort"


@pytest.mark.slurm
def test_an_array_of_three_tasks_is_three_jobs(cluster: Cluster) -> None:  # noqa: F811
    array = _sbatch("--array=0-2", "--gres=gpu:1", "-t", "5", "-J", "arr", "-o", str(E2E_DIR / "out" / "%A_%a.out"),
                    "--wrap", f"{PRINT_IDS}; sleep 2")
    tasks = [f"{array}_{i}" for i in range(3)]
    states = cluster.wait(*tasks)
    assert all(s == ("COMPLETED", "0:0") for s in states.values()), f"{states}\n{cluster.diagnostics()}"

    def ended() -> bool:
        return cluster.scalar("SELECT count(*) FROM jobs WHERE job_id = ANY(%s) AND state = 'completed'", tasks) == 3

    cluster.wait_for(f"array {array}'s three tasks, ended", ended)
    # Exactly the array's ids: on a new Slurm the array is job 1, and a LIKE '1%' would match 10, 1_0, ...
    rows = cluster.query("SELECT job_id, user_name, name, gpus FROM jobs WHERE job_id = ANY(%s) OR job_id = %s "
                         "ORDER BY job_id", tasks, array)
    # Three jobs under the ids users see; nothing under the array's bare id or the tasks' own ids.
    assert [r[0] for r in rows] == tasks
    own_ids = [cluster.jobs[t]["SLURM_JOB_ID"] for t in tasks]
    assert cluster.scalar("SELECT count(*) FROM jobs WHERE job_id = ANY(%s)", [i for i in own_ids if i != array]) == 0
    for task, (_, user, name, gpus) in zip(tasks, rows, strict=True):
        assert (user, name) == ("root", "arr") and len(gpus) == 1
        printed = cluster.jobs[task]
        # The prolog (the job row, the token), the task prolog (JOBSIGHT_JOB_ID) and the epilog agree.
        assert printed["JOBSIGHT_JOB_ID"] == task
        claims = verify_token(cluster.secret, printed["JOBSIGHT_TOKEN"])
        assert (claims.kind, claims.job) == ("job", task)
    hooks_log = (E2E_DIR / "hooks.log").read_text() if (E2E_DIR / "hooks.log").exists() else ""
    assert "Traceback" not in hooks_log, hooks_log[-3000:]


@pytest.mark.slurm
def test_a_requeued_job_keeps_its_two_runs_apart(cluster: Cluster) -> None:  # noqa: F811
    # Run 0 would sleep for minutes and is requeued; run 1 (SLURM_RESTART_COUNT=1) ends by itself.
    script = (f"{PRINT_IDS}; if [ \"${{SLURM_RESTART_COUNT:-0}}\" -ge 1 ]; then sleep 4; exit 0; fi; sleep 300")
    job = _sbatch("--requeue", "--open-mode=append", "--gres=gpu:1", "-t", "5", "-J", "rq",
                  "-o", str(E2E_DIR / "out" / "%j.out"), "--wrap", script)
    _wait_state(job, ("RUNNING",))

    def run0_sampled() -> bool:
        return bool(cluster.scalar("SELECT count(*) FROM gpu_samples WHERE job_id = %s", job))

    cluster.wait_for(f"job {job}'s first samples", run0_sampled)
    _scontrol("requeue", job)
    # slurmctld holds a requeued job back for cred_expire (10 s in tests/slurm/slurm.conf.in); it must
    # not be started sooner by hand: slurmd would not run its prolog again.
    _wait_state(job, ("PENDING",))
    states = cluster.wait(job)
    assert states[job] == ("COMPLETED", "0:0"), f"{states}\n{cluster.diagnostics()}"
    assert "Restarts=1" in _scontrol("show", "job", "-o", job)

    def second_run_summarised() -> bool:
        summary = cluster.query("SELECT summary FROM job_summaries WHERE job_id = %s", job)
        if not summary or summary[0][0].get("run") != 1:
            return False
        # Every sample of run 1 that reached the collector is in its summary (late ones recompute it).
        counted = sum(g["samples"] for g in summary[0][0]["gpus"])
        stored = cluster.scalar("SELECT count(*) FROM gpu_samples g JOIN jobs j USING (cluster, job_id) "
                                "WHERE g.job_id = %s AND g.ts >= j.run_start", job)
        return counted == stored > 0

    try:
        cluster.wait_for(f"job {job}'s second run, summarised", second_run_summarised)
    except AssertionError as exc:
        facts = {table: cluster.query(f"SELECT * FROM {table} WHERE job_id = %s", job)
                 for table in ("jobs", "job_runs", "job_summaries")}
        samples = cluster.query("SELECT min(ts), max(ts), count(*) FROM gpu_samples WHERE job_id = %s", job)
        raise AssertionError(f"{exc}\nstored: {facts}\nsamples: {samples}") from None
    state, exit_code, run, start, run_start, end = cluster.query(
        "SELECT state, exit_code, run, start_time, run_start, end_time FROM jobs WHERE job_id = %s", job)[0]
    assert (state, exit_code, run) == ("completed", 0, 1)
    assert start < run_start < end

    # Run 0: closed with its own start and end, before run 1 began.
    runs = cluster.query("SELECT run, start_time, end_time, state FROM job_runs WHERE job_id = %s ORDER BY run", job)
    assert [r[0] for r in runs] == [0]
    assert runs[0][1] == start and runs[0][2] is not None and runs[0][2] <= run_start
    assert runs[0][3] == "requeued", runs

    # Samples of both runs are stored; the summary has run 1's only.
    before = cluster.scalar("SELECT count(*) FROM gpu_samples WHERE job_id = %s AND ts < %s", job, run_start)
    assert before > 0
    summary: dict[str, Any] = cluster.query("SELECT summary FROM job_summaries WHERE job_id = %s", job)[0][0]
    assert dt.datetime.fromisoformat(summary["start"]) == run_start
    assert all(dt.datetime.fromisoformat(g["first"]) >= run_start for g in summary["gpus"])
    assert [r["run"] for r in summary["runs"]] == [0]
    # GPU-hours: both runs (the pending time between them is not counted); run 1's alone is less.
    run0_s = (runs[0][2] - runs[0][1]).total_seconds()
    run1_s = (end - run_start).total_seconds()
    assert summary["run_gpu_hours"] == pytest.approx(summary["gpu_count"] * run1_s / 3600)
    assert summary["gpu_hours"] == pytest.approx(summary["gpu_count"] * (run0_s + run1_s) / 3600)
    assert cluster.scalar("SELECT gpu_hours FROM job_summaries WHERE job_id = %s", job) == pytest.approx(
        summary["gpu_hours"])
    # Both runs' task prologs exported the same id.
    text = (E2E_DIR / "out" / f"{job}.out").read_text()
    assert text.count(f"JOBSIGHT_JOB_ID={job}\n") == 2 and "SLURM_RESTART_COUNT=1" in text
