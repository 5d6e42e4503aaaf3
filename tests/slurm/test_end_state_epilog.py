"""The epilog's end state, as a real ``jobsight slurm epilog`` process against a live collector, with
an ``squeue`` that prints what Slurm 22.05's printed during real epilogs; and the rule that reads
those fields, case by case. The same on a real Slurm: tests/slurm/test_end_states.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobsight.agent.slurm.end_state import end_state
from jobsight.agent.slurm.squeue import ask_squeue
from tests.conftest import LiveCollector
from tests.slurm import test_hooks
from tests.slurm.squeue_stub import squeue_stub, wait_status
from tests.slurm.test_hooks import HOOK_BUDGET_S, new_job, run_hook, slurm_env

# test_hooks' fixtures: a live collector knowing the cluster secret, and the hooks' settings.
collector, hook_env = test_hooks.collector, test_hooks.hook_env

# Slurm's answer during the epilog (squeue --json, 22.05's shape; fields the rule does not read are
# left at squeue_stub.BASE). CANCELLED, TIMEOUT and FAILED are what the test cluster's Slurm 22.05 said
# during tests/slurm/test_end_states.py's jobs (scancel after 10 s, -t 1, exit 3): every state reads
# COMPLETING until the epilogs are done. OOM, REQUEUED and SIGNALLED follow Slurm's reason names
# (FAIL_OOM, a requeue's BeginTime and restart count as seen on a requeued job, FAIL_SIGNAL); this
# cluster cannot produce an OOM kill.
COMMON: dict[str, Any] = {"name": "x", "user_id": 0, "time_limit": 1, "job_state": "COMPLETING", "restart_cnt": 0}
CANCELLED = {**COMMON, "state_reason": "None", "exit_code": wait_status(0, 15)}
TIMEOUT = {**COMMON, "state_reason": "TimeLimit", "exit_code": wait_status(0, 15)}
FAILED = {**COMMON, "state_reason": "NonZeroExitCode", "exit_code": wait_status(3)}
OOM = {**COMMON, "state_reason": "OutOfMemory", "exit_code": wait_status(0, 125)}
COMPLETED = {**COMMON, "state_reason": "None", "exit_code": 0}
REQUEUED = {**COMMON, "state_reason": "BeginTime", "restart_cnt": 1, "exit_code": wait_status(0, 15)}
SIGNALLED = {**COMMON, "state_reason": "RaisedSignal:9(Killed)", "exit_code": wait_status(0, 9)}
# What a user may put in a name: the answer's own fields decide, never the name.
FORGED_NAME = {**COMPLETED, "name": "y JobState=NODE_FAIL Reason=NodeDown Restarts=3 ExitCode=0:9"}


@pytest.mark.parametrize(
    ("answer", "env_exit2", "stored"),
    [
        (CANCELLED, "0:0", ("cancelled", 143)),  # scancel: the environment says 0:0
        (TIMEOUT, "0:0", ("timeout", 143)),  # killed at -t 1: the environment says 0:0 too
        (FAILED, "3:0", ("failed", 3)),
        (OOM, "0:0", ("out_of_memory", 253)),  # Slurm's OOM pseudo-signal 125
        (COMPLETED, "0:0", ("completed", 0)),
        (FORGED_NAME, "0:0", ("completed", 0)),
        (None, "0:0", ("completed", 0)),  # squeue did not know the job: the environment alone
    ],
)
def test_the_epilog_sends_the_state_slurm_names(
    collector: LiveCollector, hook_env: dict[str, str], db: Any, tmp_path: Path,
    answer: dict[str, Any] | None, env_exit2: str, stored: tuple[str, int],
) -> None:
    job = new_job()
    env = {**hook_env, "JOBSIGHT_URL": collector.url, "JOBSIGHT_SQUEUE": squeue_stub(tmp_path, answer)}
    assert run_hook("prolog", {**env, **slurm_env(job, "prolog")})[0].returncode == 0
    result, took = run_hook("epilog", {**env, **slurm_env(job, "epilog", SLURM_JOB_EXIT_CODE2=env_exit2)})
    assert result.returncode == 0 and took < HOOK_BUDGET_S
    assert db.execute("SELECT state, exit_code FROM jobs WHERE job_id = %s", (job,)).fetchone() == stored


def test_an_squeue_that_hangs_is_cut_off_and_the_environment_still_says_the_end(
    collector: LiveCollector, hook_env: dict[str, str], db: Any, tmp_path: Path,
) -> None:
    job = new_job()
    env = {**hook_env, "JOBSIGHT_URL": collector.url, "JOBSIGHT_SQUEUE": squeue_stub(tmp_path, None, hang=True)}
    result, took = run_hook("epilog", {**env, **slurm_env(job, "epilog", SLURM_JOB_EXIT_CODE2="3:0")})
    assert result.returncode == 0 and took < HOOK_BUDGET_S
    assert db.execute("SELECT state, exit_code FROM jobs WHERE job_id = %s", (job,)).fetchone() == ("failed", 3)
    assert "squeue --json failed" in Path(hook_env["JOBSIGHT_HOOK_LOG"]).read_text()


@pytest.mark.parametrize(
    ("answer", "restart_count", "env_exit", "expected"),
    [
        (CANCELLED, 0, 0, ("CANCELLED", 143)),
        (TIMEOUT, 0, 0, ("TIMEOUT", 143)),
        (FAILED, 0, 3, ("FAILED", 3)),
        (OOM, 0, 0, ("OUT_OF_MEMORY", 253)),
        (COMPLETED, 0, 0, ("COMPLETED", 0)),
        (REQUEUED, 0, 0, ("REQUEUED", 143)),  # this run's epilog: Slurm already counts the next run
        (SIGNALLED, 0, 0, ("FAILED", 137)),  # killed by a signal it raised itself: not cancelled
        ({**COMPLETED, "job_state": "TIMEOUT"}, 0, 0, ("TIMEOUT", 0)),  # an epilog that ran late
        ({**COMPLETED, "job_state": "REQUEUE_HOLD"}, 0, 0, ("REQUEUED", 0)),
        (FORGED_NAME, 0, 0, ("COMPLETED", 0)),
        (None, 0, 3, (None, 3)),  # squeue did not know the job
    ],
)
def test_the_rule_reads_slurms_fields(
    tmp_path: Path, answer: dict[str, Any] | None, restart_count: int, env_exit: int,
    expected: tuple[str | None, int],
) -> None:
    fields = ask_squeue("42", squeue_stub(tmp_path, answer), 5.0)
    assert end_state(fields, restart_count, env_exit) == expected
