"""Waste policies on a real Slurm: an idle batch job is warned twice and cancelled with its reason added
after what the site kept in Slurm's ``AdminComment``; what a policy exempts, a dry run, a telemetry gap
and a job that went back to work are left running; a job without a batch script whose time limit is
past the interactive cap is cancelled like any other; a corrupted jobs row under the id
``--user=jobsight-tester`` cancels none of that user's jobs (collector/passes/actions.py).

Jobs are submitted by the ordinary user :data:`~tests.slurm.test_hostile_jobs.USER` (``sbatch``, and
``salloc --no-shell`` for the interactive job: no batch script, so ``batch_flag`` is false). The node
daemon runs on the fake NVML with every GPU at 0 % (``idle_gpus.json``) or 90 % (``busy_gpus.json``);
a scenario is read when the daemon starts, so the load changes by restarting it; it ships every
0.5 s. The collector runs with short timings: findings every second (``idle_allocation`` after 12 s
under 5 %), actions every second, a ladder of 3 s / 6 s / 10 s counted from the finding's opening,
samples stale for the actions after 3 s (the health rule's own staleness is an hour off, so a gap
leaves the finding open while the idle window still holds samples, and only the actions' guard
holds the job).

Phases, in file order (the four GPUs are shared): the idle job, an interactive job, an exempt
account's job and a dry-run account's job at once; then a job whose daemon stops after its first
warning; then a job whose daemon comes back busy before its action; then the corrupted row, while
the user's other jobs run; then an ``salloc`` job with a 10 h limit. The test cluster has no
accounting, so nothing enforces ``-A``: the collector is told it does
(``JOBSIGHT_ACTIONS_ACCOUNTS_ENFORCED``) to exercise account filters as a site with enforced
associations has them; a site without leaves it false and may list no account. Needs root and the test cluster
(``bash tests/slurm/setup_cluster.sh``); skips otherwise, fails instead with
``JOBSIGHT_REQUIRE_SLURM=1`` (CI). ``/etc/jobsight/hooks.env`` points at this module's collector and is
put back (``JOBSIGHT_BIN`` only) at the end, as in tests/slurm/test_e2e.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobsight.collector.store import migrate
from tests.conftest import REPO, LiveCollector, create_database
from tests.slurm.slurm_commands import SALLOC, SBATCH, SCANCEL, SCONTROL, SQUEUE, busy_queue
from tests.slurm.test_e2e import FINAL_STATES, SLURM_BINARIES, _free_port, _setup_cluster, _unavailable, job_state
from tests.slurm.test_hostile_jobs import USER, ordinary_user

pytestmark = pytest.mark.slurm

WORK = Path("/var/tmp/jobsight-waste")
REGISTRATIONS = Path("/run/jobsight/jobs")
BINARIES = (*SLURM_BINARIES, SALLOC, SCANCEL, "/usr/sbin/runuser")

POLICY = "idle-cancel"
DRY_POLICY = "idle-dry"
EXEMPT_ACCOUNT = "exemptacct"
DRY_ACCOUNT = "dryacct"
WARN_S, WARN_AGAIN_S, ACT_S = 3.0, 6.0, 10.0
IDLE_MIN_S = 12.0
"""Longer than the silent job's gap up to its action and margin: the health rule stops calling a GPU
idle when its idle window holds no sample, and the finding must stay open for the actions' own
staleness guard to be what holds the job."""
STALE_S = 3.0
DAEMON_BATCH_AGE_S = 0.5
"""The daemon's own default (10 s) would leave its samples older than the idle window between batches."""
MARGIN_S = 3.0
"""Past ``act_after_s`` by this much: three action passes had their chance."""
LADDER = {"warn_after_s": WARN_S, "warn_again_after_s": WARN_AGAIN_S, "act_after_s": ACT_S, "action": "cancel"}
POLICIES = [
    {"name": POLICY, "rule": "idle_allocation", **LADDER, "dry_run": False, "partitions": ["gpu"],
     "exempt_interactive": True, "exempt_accounts": [EXEMPT_ACCOUNT, DRY_ACCOUNT]},
    {"name": DRY_POLICY, "rule": "idle_allocation", **LADDER, "dry_run": True, "accounts": [DRY_ACCOUNT]},
]
COLLECTOR_ENV = {
    "JOBSIGHT_HEALTH_INTERVAL_S": "1", "JOBSIGHT_HEALTH_RULES": '["idle_allocation"]',
    "JOBSIGHT_HEALTH_IDLE_UTIL": "5", "JOBSIGHT_HEALTH_IDLE_MIN_S": str(IDLE_MIN_S),
    "JOBSIGHT_HEALTH_SAMPLE_STALE_S": "3600",
    "JOBSIGHT_ACTIONS_POLICIES": json.dumps(POLICIES), "JOBSIGHT_ACTIONS_INTERVAL_S": "1",
    "JOBSIGHT_ACTIONS_MAX_ACTIONS_PER_HOUR": "10", "JOBSIGHT_ACTIONS_STALE_AFTER_S": str(STALE_S),
    "JOBSIGHT_ACTIONS_SCANCEL": SCANCEL, "JOBSIGHT_ACTIONS_SCONTROL": SCONTROL,
    "JOBSIGHT_ACTIONS_SQUEUE": SQUEUE, "JOBSIGHT_ACTIONS_ACCOUNTS_ENFORCED": "true",
}
REASON = re.compile(r"^jobsight: GPUs idle \d+ min \(policy " + re.escape(POLICY) + r"\)$")
SITE_COMMENT = "site: keep"
"""What the site keeps in the idle job's ``AdminComment`` before jobsight acts (set as root)."""
WAIT_S = 60.0


def _slurm_job(job: str) -> dict[str, Any]:
    """The job as ``squeue --json`` has it (its ``admin_comment`` too); ``{}`` when Slurm forgot it."""
    # Read as UTF-8 with U+FFFD: Slurm 22.05 answers with every job it remembers, and the hostile tests'
    # job named with bytes that are not UTF-8 may be among them. --states=all: 26.05 answers a job that
    # has ended (a cancelled one whose admin_comment is read) only with it; 22.05 takes it too.
    out = subprocess.run([SQUEUE, "--json", "--states=all", "-j", job], capture_output=True, encoding="utf-8",
                         errors="replace", timeout=10,
                         env={"PATH": "/usr/bin:/bin"}).stdout
    jobs = json.loads(out or "{}").get("jobs", [])
    return next((j for j in jobs if str(j.get("job_id")) == job), {})


class Daemon:
    """The node daemon on the fake NVML, stopped and started on a scenario."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log = env, log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, scenario: str) -> None:
        from tests.fake_nvml.build import SCENARIOS

        self.stop()
        with open(self.log, "ab") as log:
            log.write(f"--- daemon on {scenario}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "jobsight", "agent", "--interval", "0.5"],
                env={**self.env, "FAKE_NVML_SCENARIO": str(SCENARIOS / scenario)}, cwd=REPO, stdout=log,
                stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)
        self.process = None


@dataclass
class Waste:
    collector: LiveCollector
    daemon: Daemon
    database_url: str
    admin_token: str
    user_dir: Path
    jobs: dict[str, str] = field(default_factory=dict)
    """What each job is for → its Slurm job id."""

    # -- Slurm -----------------------------------------------------------------------------------

    def sbatch(self, what: str, *args: str) -> str:
        result = subprocess.run(
            ["/usr/sbin/runuser", "-u", USER, "--", SBATCH, "--parsable", "--gres=gpu:1", "-t", "5",
             "-J", f"waste-{what}", "-D", str(self.user_dir), "-o", str(self.user_dir / "%j.out"), *args,
             "--wrap", "exec /bin/sleep 300"],
            env={"PATH": "/usr/bin:/bin", "HOME": str(self.user_dir), "LANG": "C.UTF-8"}, cwd=self.user_dir,
            capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr
        self.jobs[what] = result.stdout.strip().split(";")[0]
        return self.jobs[what]

    def salloc(self, what: str, limit: str = "5") -> str:
        """An interactive allocation with no shell: salloc returns once the prolog ran; the job runs on."""
        result = subprocess.run(
            ["/usr/sbin/runuser", "-u", USER, "--", SALLOC, "--no-shell", "--gres=gpu:1", "-t", limit,
             "-J", f"waste-{what}"],
            env={"PATH": "/usr/bin:/bin", "HOME": str(self.user_dir), "LANG": "C.UTF-8"}, cwd=self.user_dir,
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=90)
        granted = re.search(r"Granted job allocation (\d+)", result.stderr + result.stdout)
        assert result.returncode == 0 and granted, f"salloc: {result.returncode} {result.stderr}"
        self.jobs[what] = granted.group(1)
        return self.jobs[what]

    def admin_comment(self, what: str, text: str) -> None:
        """Set the job's ``AdminComment`` as the site's admin (root) does."""
        result = subprocess.run([SCONTROL, "update", f"JobId={self.jobs[what]}", f"AdminComment={text}"],
                                capture_output=True, text=True, timeout=10)
        assert result.returncode == 0, result.stderr

    def state(self, what: str) -> str:
        return job_state(self.jobs[what])[0].split("+")[0]

    def cancel(self, what: str) -> None:
        subprocess.run([SCANCEL, self.jobs[what]], capture_output=True, timeout=10)
        self.wait(f"job {what} ended", lambda: self.state(what) in FINAL_STATES)

    # -- the collector ---------------------------------------------------------------------------

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()

    def steps(self, what: str) -> list[tuple[Any, ...]]:
        """(policy, step, dry_run, outcome, detail) of the job's actions, in order."""
        return self.query(
            "SELECT policy, step, dry_run, outcome, detail FROM actions WHERE job_id = %s AND cluster = 'default' "
            "ORDER BY at, id", self.jobs[what])

    def finding(self, what: str) -> tuple[Any, ...] | None:
        """(id, state, opened_at, resolved_at, now) of the job's latest idle_allocation finding."""
        rows = self.query(
            "SELECT id, state, opened_at, resolved_at, now() FROM findings WHERE job_id = %s AND cluster = 'default' "
            "AND rule = 'idle_allocation' ORDER BY opened_at DESC, id DESC LIMIT 1", self.jobs[what])
        return rows[0] if rows else None

    def past_action(self, what: str) -> bool:
        """Whether the job's finding opened more than ``act_after_s`` plus the margin ago."""
        row = self.finding(what)
        return row is not None and (row[4] - row[2]).total_seconds() > ACT_S + MARGIN_S

    def api_job(self, what: str) -> dict[str, Any]:
        request = urllib.request.Request(f"{self.collector.url}/v1/jobs/{self.jobs[what]}",
                                         headers={"Authorization": f"Bearer {self.admin_token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]

    def wait(self, what: str, check: Callable[[], bool], timeout: float = WAIT_S) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not after {timeout:.0f} s\n{self.diagnostics()}")
            time.sleep(0.3)

    def diagnostics(self) -> str:
        parts = [f"jobs: { {what: (job, job_state(job)) for what, job in self.jobs.items()} }"]
        for what in self.jobs:
            parts.append(f"{what}: finding {self.finding(what)}, steps {self.steps(what)}")
        for path in (WORK / "hooks.log", WORK / "daemon.log", self.collector.log_path):
            try:
                parts.append(f"--- {path} (tail)\n" + path.read_text(errors="replace")[-3000:])
            except OSError:
                pass
        return "\n".join(parts)


@pytest.fixture(scope="module")
def waste(postgres: Any, data_dir: Path, admin_token: str) -> Iterator[Waste]:
    missing = [b for b in BINARIES if not os.access(b, os.X_OK)]
    if os.geteuid() != 0 or missing:
        _unavailable("the waste-policy tests need root and " + ", ".join(missing or ["the Slurm binaries"])
                     + "; run `bash tests/slurm/setup_cluster.sh` as root first")
    try:
        import pynvml  # noqa: F401

        from tests.fake_nvml.build import GccMissing, build_fake_nvml

        library = build_fake_nvml()
    except (ImportError, GccMissing) as exc:
        _unavailable(f"the node daemon needs pynvml and the fake NVML: {exc}")
    if queue := busy_queue():
        _unavailable(f"other jobs are in the Slurm queue; the waste-policy tests need the test cluster to themselves:\n"
                     f"{queue}")
    user = ordinary_user()

    shutil.rmtree(WORK, ignore_errors=True)
    for sub in ("spool", "daemon", "user"):
        (WORK / sub).mkdir(parents=True, mode=0o755)
    WORK.chmod(0o755)
    os.chown(WORK / "user", user.pw_uid, user.pw_gid)
    secret_file = WORK / "cluster_secret"
    secret_file.write_text(uuid.uuid4().hex * 2 + "\n")
    secret_file.chmod(0o600)
    for stale in REGISTRATIONS.glob("*.json"):  # an interrupted run's registrations would claim the GPUs
        stale.unlink()

    # A database of its own: the session's holds other tests' running jobs with open idle findings, which
    # this collector's policies would try to act on (and count against the hourly cap).
    database_url = create_database(postgres, f"waste_{uuid.uuid4().hex[:12]}")
    migrate.upgrade(database_url)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    shared = {"JOBSIGHT_URL": url, "JOBSIGHT_SECRET_FILE": str(secret_file),
              "JOBSIGHT_SPOOL_DIR": str(WORK / "spool"), "JOBSIGHT_NODE": socket.gethostname().split(".")[0]}
    _setup_cluster({**shared, "JOBSIGHT_HOOK_LOG": str(WORK / "hooks.log")})
    collector = LiveCollector(database_url, data_dir, admin_token, WORK / "collector.log",
                              env={"JOBSIGHT_SECRET_FILE": str(secret_file), **COLLECTOR_ENV})
    collector.port, collector.url = port, url
    daemon_env = {**os.environ, **shared, "JOBSIGHT_DATA_DIR": str(WORK / "daemon"),
                  "JOBSIGHT_NVML_LIBRARY": str(library), "JOBSIGHT_BATCH_AGE_S": str(DAEMON_BATCH_AGE_S)}
    for name in ("JOBSIGHT_TOKEN", "JOBSIGHT_TOKEN_FILE", "JOBSIGHT_JOB_ID", "JOBSIGHT_REGISTRATION_DIR"):
        daemon_env.pop(name, None)
    daemon = Daemon(daemon_env, WORK / "daemon.log")
    state = Waste(collector, daemon, database_url, admin_token, WORK / "user")
    try:
        collector.start()
        daemon.start("idle_gpus.json")
        # The first phase's four jobs at once, on the four GPUs.
        state.sbatch("idle")
        state.admin_comment("idle", SITE_COMMENT)
        state.sbatch("exempt", "-A", EXEMPT_ACCOUNT)
        state.sbatch("dry", "-A", DRY_ACCOUNT)
        state.salloc("interactive")
        yield state
    finally:
        for job in state.jobs.values():
            subprocess.run([SCANCEL, job], capture_output=True, timeout=10)
        # Out of the queue (epilogs run) before the collector goes and the next Slurm module starts.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(
                job_state(job)[0].split("+")[0] not in FINAL_STATES for job in state.jobs.values()):
            time.sleep(0.3)
        daemon.stop()
        collector.kill()
        _setup_cluster({})  # hooks.env back to JOBSIGHT_BIN only


def test_an_idle_batch_job_is_warned_twice_then_cancelled_with_its_reason(waste: Waste) -> None:
    waste.wait("the idle job cancelled", lambda: waste.state("idle") in FINAL_STATES)
    assert waste.state("idle") == "CANCELLED", waste.diagnostics()
    comment = _slurm_job(waste.jobs["idle"]).get("admin_comment", "")
    # The site's AdminComment is still there, jobsight's reason after it.
    theirs, _, said = comment.partition("; ")
    assert theirs == SITE_COMMENT and REASON.match(said), f"AdminComment {comment!r}\n{waste.diagnostics()}"

    steps = waste.steps("idle")
    assert [(policy, step, dry, outcome) for policy, step, dry, outcome, _ in steps] == [
        (POLICY, "warn", False, "recorded"), (POLICY, "warn_again", False, "recorded"),
        (POLICY, "act", False, "done")], waste.diagnostics()
    assert steps[-1][4] == said  # the reason recorded is the one Slurm shows
    # The ladder counted from the finding's opening.
    opened = waste.finding("idle")[2]  # type: ignore[index]
    at = {step: (when - opened).total_seconds() for step, when in waste.query(
        "SELECT step, at FROM actions WHERE job_id = %s", waste.jobs["idle"])}
    assert WARN_S <= at["warn"] < at["warn_again"] < at["act"] and WARN_AGAIN_S <= at["warn_again"], at
    assert ACT_S <= at["act"] < ACT_S + MARGIN_S, at

    # Slurm's end state, stored by the epilog, with jobsight's reason beside it.
    waste.wait("the idle job's end stored", lambda: waste.api_job("idle").get("state") == "cancelled")
    row = waste.api_job("idle")
    assert (row["state"], row["end_reason"], row["user_name"]) == ("cancelled", said, USER)


def test_an_interactive_job_and_an_exempt_accounts_job_are_left_running(waste: Waste) -> None:
    waste.wait("the idle job cancelled", lambda: waste.state("idle") in FINAL_STATES)
    for what in ("interactive", "exempt"):
        waste.wait(f"job {what} past its action", lambda what=what: waste.past_action(what))  # type: ignore[misc]
    facts = {what: waste.query("SELECT batch, account FROM jobs WHERE job_id = %s", waste.jobs[what])[0]
             for what in ("interactive", "exempt")}
    assert facts == {"interactive": (False, None), "exempt": (True, EXEMPT_ACCOUNT)}, waste.diagnostics()
    assert waste.steps("interactive") == [(POLICY, "exempt", False, "recorded", "interactive (no batch script)")]
    assert waste.steps("exempt") == [(POLICY, "exempt", False, "recorded", "exempt account")]
    for what in ("interactive", "exempt"):
        assert waste.state(what) == "RUNNING", waste.diagnostics()
        assert waste.finding(what)[1] == "open"  # type: ignore[index]  # idle all along
        assert _slurm_job(waste.jobs[what]).get("admin_comment", "") == ""


def test_a_dry_run_policy_records_its_whole_ladder_and_acts_on_nothing(waste: Waste) -> None:
    waste.wait("the dry job's dry action", lambda: any(step == "act" for _, step, *_ in waste.steps("dry")))
    waste.wait("the dry job past its action", lambda: waste.past_action("dry"))
    steps = waste.steps("dry")
    assert [(policy, step, dry, outcome) for policy, step, dry, outcome, _ in steps] == [
        (POLICY, "exempt", False, "recorded"), (DRY_POLICY, "warn", True, "recorded"),
        (DRY_POLICY, "warn_again", True, "recorded"), (DRY_POLICY, "act", True, "recorded")], waste.diagnostics()
    assert re.match(r"^jobsight: GPUs idle \d+ min \(policy " + re.escape(DRY_POLICY) + r"\)$", steps[-1][4]), steps
    assert waste.state("dry") == "RUNNING", waste.diagnostics()
    assert _slurm_job(waste.jobs["dry"]).get("admin_comment", "") == ""
    assert waste.query("SELECT end_reason FROM jobs WHERE job_id = %s", waste.jobs["dry"]) == [(None,)]


def test_a_job_whose_node_stops_sending_is_not_cancelled(waste: Waste) -> None:
    waste.wait("the idle job's GPU free", lambda: waste.state("idle") in FINAL_STATES)
    waste.sbatch("silent")
    waste.wait("the silent job's first warning", lambda: (POLICY, "warn") in {s[:2] for s in waste.steps("silent")})
    waste.daemon.stop()
    waste.wait("the silent job past its action", lambda: waste.past_action("silent"), timeout=ACT_S + 2 * MARGIN_S)
    steps = {step for policy, step, *_ in waste.steps("silent")}
    assert "act" not in steps and steps <= {"warn", "warn_again"}, waste.diagnostics()
    # The finding was open all that time (the health rule still called the job idle): only the stale
    # samples held the action back.
    _, _, opened, resolved, _ = waste.finding("silent")  # type: ignore[misc]
    assert resolved is None or (resolved - opened).total_seconds() > ACT_S + MARGIN_S, waste.diagnostics()
    [(silent_for,)] = waste.query("SELECT extract(epoch FROM now() - max(last_ts)) FROM gpu_minutes WHERE job_id = %s",
                                  waste.jobs["silent"])
    assert silent_for > STALE_S, silent_for
    assert waste.state("silent") == "RUNNING", waste.diagnostics()
    waste.cancel("silent")  # its GPU for the last job; the daemon comes back on idle GPUs for it


def test_a_job_back_at_work_before_its_action_is_not_cancelled(waste: Waste) -> None:
    waste.daemon.start("idle_gpus.json")
    waste.sbatch("recovers")
    waste.wait("the recovering job's first warning",
               lambda: (POLICY, "warn") in {s[:2] for s in waste.steps("recovers")})
    waste.daemon.start("busy_gpus.json")  # its GPU at 90 % from the next sample on
    waste.wait("the recovering job's finding resolved", lambda: waste.finding("recovers")[1] == "resolved")  # type: ignore[index]
    _, _, opened, resolved, _ = waste.finding("recovers")  # type: ignore[misc]
    assert (resolved - opened).total_seconds() < ACT_S, f"back at work after its action was due\n{waste.diagnostics()}"
    waste.wait("the recovering job past its action", lambda: waste.past_action("recovers"))
    steps = {step for policy, step, *_ in waste.steps("recovers")}
    assert "act" not in steps and "warn" in steps, waste.diagnostics()
    assert waste.state("recovers") == "RUNNING", waste.diagnostics()
    # No idle finding reopened while it works.
    assert waste.query("SELECT count(*) FROM findings WHERE job_id = %s AND state = 'open'",
                       waste.jobs["recovers"]) == [(0,)]
    # Everything left to the end is still running: nothing was cancelled but the idle job.
    assert {what: waste.state(what) for what in ("interactive", "exempt", "dry", "recovers")} == dict.fromkeys(
        ("interactive", "exempt", "dry", "recovers"), "RUNNING"), waste.diagnostics()


def test_a_job_id_spelt_as_an_option_cancels_none_of_the_users_jobs(waste: Waste,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A corrupted ``jobs`` row (the wire refuses such an id; written here straight into the table) under
    ``--user=jobsight-tester``, registered, idle for hours with a fresh sample: the actions pass, with the
    collector's settings and Slurm's real commands, as root, gives it no step. The old pass ran
    ``scancel --user=jobsight-tester`` on its third pass: every job of the user's. Run in one transaction
    rolled back at the end, so the live collector's evaluator never sees (nor resolves) the row."""
    from psycopg.rows import dict_row

    from jobsight.collector.config.actions import load_action_settings
    from jobsight.collector.passes.actions import WasteActions

    running = [what for what in ("interactive", "exempt", "dry", "recovers") if waste.state(what) == "RUNNING"]
    assert running, f"none of the user's jobs runs\n{waste.diagnostics()}"
    hostile = f"--user={USER}"
    settings = load_action_settings(
        policies=POLICIES, scancel=SCANCEL, scontrol=SCONTROL, squeue=SQUEUE,
        accounts_enforced=True, max_actions_per_hour=100, stale_after_s=STALE_S)
    with psycopg.connect(waste.database_url, row_factory=dict_row) as conn:
        conn.execute("""INSERT INTO jobs (cluster, job_id, user_name, nodes, state, batch, time_limit_s, partition)
                        VALUES ('default', %s, %s, ARRAY[%s], 'running', true, 86400, 'gpu')""",
                     (hostile, USER, socket.gethostname().split(".")[0]))
        conn.execute("""INSERT INTO gpu_minutes (cluster, job_id, ts, node, gpu_index, gpu_uuid, samples, util_gpu_sum,
                            util_gpu_n, util_idle_n, util_mem_sum, util_mem_n, power_sum, power_n, temp_sum, temp_n,
                            energy_n, first_ts, last_ts, lost)
                        VALUES ('default', %s, date_trunc('minute', now()), 'n', 0, 'GPU-x', 1, 0, 1, 1, 0, 1, 0, 0,
                                0, 0, 0, now(), now(), false)""", (hostile,))
        conn.execute("""INSERT INTO findings (cluster, job_id, rule, severity, opened_at, updated_at, title, message,
                                              evidence)
                        VALUES ('default', %s, 'idle_allocation', 'warning', now() - interval '3 hours', now(), 'idle',
                                'idle', '{}')""", (hostile,))
        actions = WasteActions(settings)
        with caplog.at_level("WARNING", logger="jobsight.collector.passes.actions"):
            for _ in range(4):
                actions.act_once(conn)
        recorded = conn.execute("SELECT step FROM actions WHERE job_id = %s", (hostile,)).fetchall()
        conn.rollback()
    assert recorded == [], recorded
    assert f"job '{hostile}' of cluster 'default' is not a Slurm job id" in caplog.text, caplog.text
    assert {what: waste.state(what) for what in running} == dict.fromkeys(running, "RUNNING"), waste.diagnostics()


def test_a_job_without_a_batch_script_past_the_interactive_cap_is_cancelled(waste: Waste) -> None:
    """``salloc --no-shell`` with a 10 h limit, past the default 8 h cap: not exempt as interactive."""
    waste.cancel("recovers")  # its GPU for this job
    waste.daemon.start("idle_gpus.json")
    waste.salloc("long", limit="600")
    waste.wait("the long salloc job cancelled", lambda: waste.state("long") in FINAL_STATES)
    assert waste.state("long") == "CANCELLED", waste.diagnostics()
    assert waste.query("SELECT batch, time_limit_s FROM jobs WHERE job_id = %s", waste.jobs["long"]) == [
        (False, 600 * 60)], waste.diagnostics()
    assert [(policy, step, outcome) for policy, step, _, outcome, _ in waste.steps("long")] == [
        (POLICY, "warn", "recorded"), (POLICY, "warn_again", "recorded"), (POLICY, "act", "done")], waste.diagnostics()
    assert REASON.match(_slurm_job(waste.jobs["long"]).get("admin_comment", "")), waste.diagnostics()
