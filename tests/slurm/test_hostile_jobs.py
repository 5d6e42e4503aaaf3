"""A shared cluster cannot be fooled by its users (issue #25): an ordinary user (not root) submits
real Slurm jobs that try to

* mint a token for another job, choose its recorded end state, or pose as an array task, through
  its *name* (``HetJobId=4242 ArrayJobId=4242 ... JobState=NODE_FAIL``): the root prolog and epilog
  read Slurm's structured answer (agent/slurm/squeue.py), never the name;
* erase the next job's registration and end by sending, first, a batch under the sources its root
  hooks will use: the ingest ledger is keyed by the sender (migration 0011);
* hide that its GPU idles by sending ``gpu_sample`` records at 95 %: for a job a prolog registered,
  only the node's samples count, and the job's own are kept as self-reported metrics.

Runs on the real test cluster of tests/slurm/test_e2e.py (its ``cluster`` fixture), as the user
:data:`USER`, made here when missing. docs/security.md lists these boundaries.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import time
from pathlib import Path

import pytest

from jobsight.protocol.tokens import verify_token
from tests.slurm.hostile_job import FORGED_UTIL
from tests.slurm.slurm_commands import SBATCH
from tests.slurm.test_e2e import E2E_DIR, Cluster, _unavailable, cluster, job_state  # noqa: F401 (the fixture)

pytestmark = pytest.mark.slurm

USER = "jobsight-tester"
HOSTILE = Path(__file__).with_name("hostile_job.py")
FORGED_NAME = ("train HetJobId=4242 ArrayJobId=4242 ArrayTaskId=1 TimeLimit=365-00:00:00 JobState=NODE_FAIL "
               "Reason=NodeDown Restarts=3 ExitCode=0:9")
SYSTEM_PYTHON = "/usr/bin/python3"
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def ordinary_user() -> pwd.struct_passwd:
    """:data:`USER`, an account with no privileges, made once (tests run as root)."""
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        pass
    made = subprocess.run(["/usr/sbin/useradd", "--system", "--no-create-home", "--shell", "/bin/sh", USER],
                          capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        _unavailable(f"cannot create the test user {USER}: {made.stderr.strip()}")
    return pwd.getpwnam(USER)


class UserJobs:
    """Jobs ``sbatch``-ed by :data:`USER` into a directory it owns."""

    def __init__(self, user: pwd.struct_passwd) -> None:
        self.user = user
        self.dir = E2E_DIR / "hostile"
        self.dir.mkdir(mode=0o755, exist_ok=True)
        os.chown(self.dir, user.pw_uid, user.pw_gid)

    def submit(self, name: str, *command: str) -> str:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.dir), "LANG": "C.UTF-8"}
        result = subprocess.run(
            ["/usr/sbin/runuser", "-u", USER, "--", SBATCH, "--parsable", "--gres=gpu:1", "-t", "5",
             "-J", name, "-D", str(self.dir), "-o", str(self.dir / "%j.out"), "--wrap", " ".join(command)],
            env=env, capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip().split(";")[0]

    def wait(self, job: str, timeout: float = 120.0) -> tuple[str, str]:
        deadline = time.monotonic() + timeout
        state = ("", "")
        while time.monotonic() < deadline:
            state = job_state(job)
            if state[0] in FINAL:
                return state
            time.sleep(0.5)
        raise AssertionError(f"job {job} not finished after {timeout:.0f} s: {state}")

    def printed(self, job: str) -> dict[str, str]:
        text = (self.dir / f"{job}.out").read_text(errors="replace")
        return dict(line.split("=", 1) for line in text.splitlines() if re.match(r"^[A-Z_]+=", line))


@pytest.fixture(scope="module")
def attack(cluster: Cluster) -> tuple[UserJobs, str, str]:  # noqa: F811
    """The hostile job (finished), then the next job, the victim (finished)."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        _unavailable(f"the hostile job runs on {SYSTEM_PYTHON} (apt-get install python3)")
    jobs = UserJobs(ordinary_user())
    # The user's own Python (standard library only); the venv's may sit where the user cannot reach.
    hostile = jobs.submit(FORGED_NAME, "exec", SYSTEM_PYTHON, str(HOSTILE))
    assert jobs.wait(hostile) == ("COMPLETED", "0:0"), cluster.diagnostics()
    victim = jobs.submit("victim", "sleep", "2")
    assert victim == str(int(hostile) + 1), "another job took the id the hostile job aimed at"
    assert jobs.wait(victim) == ("COMPLETED", "0:0"), cluster.diagnostics()
    for job in (hostile, victim):
        cluster.wait_for(f"job {job} ended", lambda job=job: bool(cluster.query(
            "SELECT 1 FROM jobs WHERE job_id = %s AND end_time IS NOT NULL", job)))
    return jobs, hostile, victim


def test_a_job_name_names_no_other_job_and_no_end_state(cluster: Cluster, attack: tuple[UserJobs, str, str]) -> None:  # noqa: F811
    jobs, hostile, _ = attack
    row = cluster.query("SELECT user_name, uid, state, exit_code, name, time_limit_s FROM jobs WHERE job_id = %s",
                        hostile)
    assert row == [(USER, jobs.user.pw_uid, "completed", 0, FORGED_NAME, 300)], cluster.diagnostics()
    assert cluster.query("SELECT job_id FROM jobs WHERE job_id IN ('4242', '4242_1')") == []
    claims = verify_token(cluster.secret, jobs.printed(hostile)["JOBSIGHT_TOKEN"])
    assert (claims.job, claims.uid) == (hostile, jobs.user.pw_uid)
    assert claims.expires_at - claims.issued_at <= 300 + 3600  # -t 5 plus the hour of grace, not a year
    assert not Path("/run/jobsight/tokens/4242.token").exists()


def test_nobody_can_make_another_jobs_start_and_end_duplicates(
    cluster: Cluster, attack: tuple[UserJobs, str, str],  # noqa: F811
) -> None:
    jobs, hostile, victim = attack
    printed = jobs.printed(hostile)
    # The hostile batches were its own job's, so they were stored, under its own name in the ledger...
    assert (printed["LEDGER_PROLOG"], printed["LEDGER_EPILOG"]) == ("200:stored", "200:stored")
    senders = cluster.query("SELECT sender FROM ingest_batches WHERE source LIKE %s ORDER BY sender",
                            f"%:slurm-%:{victim}.0")
    assert senders == [(f"job:default/{hostile}",), (f"job:default/{hostile}",),
                       (f"node:default/{cluster.host}",), (f"node:default/{cluster.host}",)]
    # ...and the victim's own prolog and epilog still registered and ended it.
    row = cluster.query("SELECT user_name, state, nodes FROM jobs WHERE job_id = %s", victim)
    assert row == [(USER, "completed", [cluster.host])]


def test_a_jobs_own_gpu_samples_do_not_hide_its_idle_gpu(cluster: Cluster, attack: tuple[UserJobs, str, str]) -> None:  # noqa: F811
    jobs, hostile, _ = attack
    assert jobs.printed(hostile)["FORGED_SAMPLES"] == "200:stored"
    # The node daemon's samples of the job's GPU are there; none of the job's own.
    cluster.wait_for(f"the node's samples of job {hostile}", lambda: bool(cluster.query(
        "SELECT 1 FROM gpu_samples WHERE job_id = %s LIMIT 1", hostile)))
    utils = [r[0] for r in cluster.query("SELECT util_gpu FROM gpu_samples WHERE job_id = %s", hostile)]
    assert utils and FORGED_UTIL not in utils
    # Samples that came after the epilog computed the summary are counted by the summary refresh pass.
    cluster.wait_for(f"job {hostile}'s summary with its GPU", lambda: bool(cluster.scalar(
        "SELECT summary -> 'gpus' <> '[]'::jsonb AND NOT summary ? 'refresh_due' FROM job_summaries "
        "WHERE job_id = %s", hostile)))
    summary = cluster.scalar("SELECT summary FROM job_summaries WHERE job_id = %s", hostile)
    assert summary["gpus"] and all(g["max_util"] < FORGED_UTIL for g in summary["gpus"]), json.dumps(summary)[:2000]
    # Kept, and shown as what they are.
    kept = cluster.query("SELECT DISTINCT name, value FROM metrics WHERE job_id = %s AND name LIKE 'self-reported/%%'",
                         hostile)
    assert [(name.rsplit("/", 1)[1], value) for name, value in kept] == [("util_gpu", FORGED_UTIL)]


def test_a_name_that_is_not_utf8_still_registers_the_job(cluster: Cluster) -> None:  # noqa: F811
    """The name's bytes reach Slurm's answer (and the hooks' environment) as they are. One byte that is
    not UTF-8 made ``squeue --json``'s whole answer unreadable, and the prolog lost what only Slurm knew
    (the time limit, an array task's id, the name); the job is registered with all of it, the bytes
    read as U+FFFD."""
    jobs = UserJobs(ordinary_user())
    name = b"bad\xff\xfe name".decode("utf-8", "surrogateescape")  # os.fsencode gives sbatch the raw bytes
    job = jobs.submit(name, "sleep", "1")
    assert jobs.wait(job) == ("COMPLETED", "0:0"), cluster.diagnostics()
    cluster.wait_for(f"job {job} ended", lambda: bool(cluster.query(
        "SELECT 1 FROM jobs WHERE job_id = %s AND end_time IS NOT NULL", job)))
    row = cluster.query("SELECT user_name, uid, name, time_limit_s, state FROM jobs WHERE job_id = %s", job)
    assert row == [(USER, jobs.user.pw_uid, "bad\ufffd\ufffd name", 300, "completed")], cluster.diagnostics()
