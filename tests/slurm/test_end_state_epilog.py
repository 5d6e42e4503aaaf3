"""The epilog's end state, as a real ``jobsight slurm epilog`` process against a live collector, with
an ``scontrol`` that prints what Slurm 22.05's printed during real epilogs; and the rule that reads
those fields, case by case. The same on a real Slurm: tests/slurm/test_end_states.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobsight.agent.slurm.end_state import end_state
from jobsight.agent.slurm.job import scontrol_job
from tests.conftest import LiveCollector
from tests.slurm import test_hooks
from tests.slurm.test_hooks import HOOK_BUDGET_S, new_job, run_hook, slurm_env

# test_hooks' fixtures: a live collector knowing the cluster secret, and the hooks' settings.
collector, hook_env = test_hooks.collector, test_hooks.hook_env

# `scontrol show job -o` during the epilog (fields the rule does not read are cut). CANCELLED, TIMEOUT
# and FAILED are verbatim from the test cluster's Slurm 22.05 during tests/slurm/test_end_states.py's
# jobs (scancel after 10 s, -t 1, exit 3): every state reads COMPLETING until the epilogs are done.
# OOM, REQUEUED and SIGNALLED follow Slurm's reason names (FAIL_OOM, a requeue's BeginTime and
# restart count as seen on a requeued job, FAIL_SIGNAL); this cluster cannot produce an OOM kill.
COMMON = ("JobName=x UserId=root(0) GroupId=root(0) Requeue=1 BatchFlag=1 TimeLimit=00:01:00 Partition=gpu "
          "NodeList=vm BatchHost=vm NumNodes=1")
CANCELLED = f"JobId=%s {COMMON} JobState=COMPLETING Reason=None Restarts=0 ExitCode=0:15"
TIMEOUT = f"JobId=%s {COMMON} JobState=COMPLETING Reason=TimeLimit Restarts=0 ExitCode=0:15"
FAILED = f"JobId=%s {COMMON} JobState=COMPLETING Reason=NonZeroExitCode Restarts=0 ExitCode=3:0"
OOM = f"JobId=%s {COMMON} JobState=COMPLETING Reason=OutOfMemory Restarts=0 ExitCode=0:125"
COMPLETED = f"JobId=%s {COMMON} JobState=COMPLETING Reason=None Restarts=0 ExitCode=0:0"
REQUEUED = f"JobId=%s {COMMON} JobState=COMPLETING Reason=BeginTime Restarts=1 ExitCode=0:15"
SIGNALLED = f"JobId=%s {COMMON} JobState=COMPLETING Reason=RaisedSignal:9(Killed) Restarts=0 ExitCode=0:9"


def _scontrol(tmp_path: Path, line: str | None, *, hang: bool = False) -> str:
    """An scontrol that prints ``line`` for the job it is asked about (or hangs)."""
    script = tmp_path / "scontrol-stub"
    body = "exec /bin/sleep 30\n" if hang else (f'printf "{line}\\n" "$4"\n' if line else "exit 1\n")
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize(
    ("line", "env_exit2", "stored"),
    [
        (CANCELLED, "0:0", ("cancelled", 143)),  # scancel: the environment says 0:0
        (TIMEOUT, "0:0", ("timeout", 143)),  # killed at -t 1: the environment says 0:0 too
        (FAILED, "3:0", ("failed", 3)),
        (OOM, "0:0", ("out_of_memory", 253)),  # Slurm's OOM pseudo-signal 125
        (COMPLETED, "0:0", ("completed", 0)),
        (None, "0:0", ("completed", 0)),  # scontrol failed: the environment alone
    ],
)
def test_the_epilog_sends_the_state_slurm_names(
    collector: LiveCollector, hook_env: dict[str, str], db: Any, tmp_path: Path,
    line: str | None, env_exit2: str, stored: tuple[str, int],
) -> None:
    job = new_job()
    env = {**hook_env, "JOBSIGHT_URL": collector.url, "JOBSIGHT_SCONTROL": _scontrol(tmp_path, line)}
    assert run_hook("prolog", {**env, **slurm_env(job, "prolog")})[0].returncode == 0
    result, took = run_hook("epilog", {**env, **slurm_env(job, "epilog", SLURM_JOB_EXIT_CODE2=env_exit2)})
    assert result.returncode == 0 and took < HOOK_BUDGET_S
    assert db.execute("SELECT state, exit_code FROM jobs WHERE job_id = %s", (job,)).fetchone() == stored


def test_an_scontrol_that_hangs_is_cut_off_and_the_environment_still_says_the_end(
    collector: LiveCollector, hook_env: dict[str, str], db: Any, tmp_path: Path,
) -> None:
    job = new_job()
    env = {**hook_env, "JOBSIGHT_URL": collector.url, "JOBSIGHT_SCONTROL": _scontrol(tmp_path, None, hang=True)}
    result, took = run_hook("epilog", {**env, **slurm_env(job, "epilog", SLURM_JOB_EXIT_CODE2="3:0")})
    assert result.returncode == 0 and took < HOOK_BUDGET_S
    assert db.execute("SELECT state, exit_code FROM jobs WHERE job_id = %s", (job,)).fetchone() == ("failed", 3)
    assert "scontrol show job failed" in Path(hook_env["JOBSIGHT_HOOK_LOG"]).read_text()


@pytest.mark.parametrize(
    ("line", "restart_count", "env_exit", "expected"),
    [
        (CANCELLED, 0, 0, ("CANCELLED", 143)),
        (TIMEOUT, 0, 0, ("TIMEOUT", 143)),
        (FAILED, 0, 3, ("FAILED", 3)),
        (OOM, 0, 0, ("OUT_OF_MEMORY", 253)),
        (COMPLETED, 0, 0, ("COMPLETED", 0)),
        (REQUEUED, 0, 0, ("REQUEUED", 143)),  # this run's epilog: Slurm already counts the next run
        (SIGNALLED, 0, 0, ("FAILED", 137)),  # killed by a signal it raised itself: not cancelled
        (COMPLETED.replace("COMPLETING", "TIMEOUT"), 0, 0, ("TIMEOUT", 0)),  # an epilog that ran late
        (COMPLETED.replace("COMPLETING", "REQUEUE_HOLD"), 0, 0, ("REQUEUED", 0)),
        ("", 0, 3, (None, 3)),  # scontrol said nothing
    ],
)
def test_the_rule_reads_slurms_fields(
    tmp_path: Path, line: str, restart_count: int, env_exit: int, expected: tuple[str | None, int]
) -> None:
    fields = scontrol_job({}, "42", _scontrol(tmp_path, line.replace("%s", "42") if line else None))
    assert end_state(fields, restart_count, env_exit) == expected
