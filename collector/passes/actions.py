"""The actions pass: what the site's waste policies do about open findings, one leader at a time.

Every ``JOBSIGHT_ACTIONS_INTERVAL_S`` the leading process reads the open findings of running jobs
that a policy acts on, with when each job's GPUs last sent a sample, decides each policy's due step
(:mod:`jobsight.collector.passes.action_ladder`) and records it in ``actions``. Only jobs a prolog
registered (a user and an allocation) under a Slurm job id are candidates: an id that is not one of
Slurm's forms (``--user=alice`` in a corrupted row) gets no step and reaches no command. An action that
is not a dry run goes through Slurm (:mod:`jobsight.collector.passes.slurm_jobs`, which checks the id
again and passes it after ``--``): the reason is added after the site's own ``AdminComment``
(read from ``squeue --json``, written with ``scontrol update``), then ``scancel`` (or ``scontrol
requeue``). At most ``max_actions_per_hour`` actions run across the cluster in any hour; past that a
due action is recorded as held back and tried again next pass.

A step is recorded before its command runs (``pending``), so a process that dies in between retries
it rather than skipping it, and a step recorded ``done`` is never taken again.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import psycopg
from psycopg.types.json import Jsonb

from jobsight.collector.config.actions import ActionSettings, Policy
from jobsight.collector.config.alerts import AlertSettings
from jobsight.collector.passes import notice_messages, notices
from jobsight.collector.passes.action_ladder import (
    ACT,
    EXEMPT,
    WARN,
    WARN_AGAIN,
    WHAT,
    Candidate,
    JobFacts,
    due_step,
    exemption,
    idle_since,
    reason,
)
from jobsight.collector.passes.leader import LeaderTimer
from jobsight.collector.passes.slurm_jobs import (
    SlurmCommandError,
    appended_comment,
    cancel_job,
    read_admin_comment,
    requeue_job,
    write_admin_comment,
)
from jobsight.protocol.slurm_ids import is_job_id, is_slurm_job_id

log = logging.getLogger("jobsight.collector.passes.actions")

ACTIONS_LOCK_KEY: Final = 0x6A6F6273_61637473 & 0x7FFFFFFFFFFFFFFF
"""Session advisory lock held by the one acting process."""
RETRIED: Final = ("pending", "held_back")
"""Outcomes that leave a step to be taken again."""
_REFUSED_KEPT: Final = 10_000
"""Refused job ids remembered (so each is logged once) before the memory starts again."""

_CANDIDATES = """
SELECT f.id AS finding_id, f.rule, f.opened_at, f.evidence, f.message AS finding_message,
       j.cluster, j.job_id, j.user_name, j.account, j.partition, j.name, j.qos, j.comment, j.batch,
       j.time_limit_s,
       (SELECT max(m.last_ts) FROM gpu_minutes m
        WHERE m.job_id = j.job_id AND m.cluster = j.cluster AND m.ts >= %(now)s - %(recent)s) AS last_sample_at
FROM findings f JOIN jobs j ON j.job_id = f.job_id AND j.cluster = f.cluster
WHERE f.state = 'open' AND j.state = 'running' AND f.rule = ANY(%(rules)s)
  -- registered by a prolog: its user (which job tokens cannot set) and its Slurm allocation
  AND j.user_name IS NOT NULL AND cardinality(j.nodes) > 0
  AND (cardinality(%(clusters)s::text[]) = 0 OR j.cluster = ANY(%(clusters)s::text[]))
ORDER BY f.opened_at, f.id
"""

_DONE = """SELECT finding_id, policy, step FROM actions
           WHERE finding_id = ANY(%(findings)s) AND outcome <> ALL(%(retried)s)"""

_ACTED_LAST_HOUR = """SELECT count(*) AS n FROM actions
                      WHERE step = 'act' AND NOT dry_run AND outcome IN ('pending', 'done', 'failed')
                        AND at > %(now)s - interval '1 hour'"""

_RECORD = """
INSERT INTO actions (cluster, job_id, finding_id, policy, rule, step, at, dry_run, outcome, detail, evidence)
VALUES (%(cluster)s, %(job_id)s, %(finding_id)s, %(policy)s, %(rule)s, %(step)s, %(at)s, %(dry_run)s,
        %(outcome)s, %(detail)s, %(evidence)s)
ON CONFLICT (job_id, cluster, finding_id, policy, step) DO UPDATE
    SET at = EXCLUDED.at, outcome = EXCLUDED.outcome, detail = EXCLUDED.detail, evidence = EXCLUDED.evidence
    WHERE actions.outcome = ANY(%(retried)s)
RETURNING id
"""

_END_REASON = "UPDATE jobs SET end_reason = %(reason)s WHERE job_id = %(job_id)s AND cluster = %(cluster)s"


@dataclass
class ActionPass:
    """What one pass did: steps recorded, by outcome."""

    steps: list[tuple[str, str, str, str]] = field(default_factory=list)
    """(job, policy, step, outcome)."""

    def count(self, outcome: str) -> int:
        return sum(1 for *_, done in self.steps if done == outcome)


@dataclass(frozen=True)
class Notify:
    """Who hears of a step: the job's user, where the alerts' settings give them an address."""

    alerts: AlertSettings
    dashboard_url: str | None = None

    def step(self, conn: psycopg.Connection[dict[str, Any]], row: dict[str, Any], policy: Policy, step: str,
             now: dt.datetime, detail: str) -> None:
        """The user's notice of a warning or a done action, in the caller's transaction (none for dry runs).
        The idle time it states counts from when the GPUs went idle (the finding's ``idle_since``)."""
        if policy.dry_run or step not in (WARN, WARN_AGAIN, ACT):
            return
        job = {"cluster": row["cluster"], "job_id": row["job_id"], "name": row["name"], "partition": row["partition"]}
        if step == ACT and policy.action != "notify-only":
            kind, message = "action", notice_messages.acted(job, action=policy.action, reason=detail,
                                                           dashboard_url=self.dashboard_url)
        else:
            act_at = row["opened_at"] + dt.timedelta(seconds=policy.act_after_s)
            kind, message = "warning", notice_messages.warning(
                job, policy=policy.name, action=policy.action, step=step, what=WHAT.get(policy.rule, policy.rule),
                idle_s=(now - _candidate(row).idle_from).total_seconds(), act_at=act_at,
                finding_message=row.get("finding_message"), dashboard_url=self.dashboard_url)
        notices.enqueue(conn, cluster=row["cluster"], job_id=row["job_id"], kind=kind,
                        sinks=[notices.user_sink(self.alerts, row["user_name"])],
                        key=f"{policy.name}:{row['finding_id']}:{step}", message=message)


class WasteActions:
    """The decisions and the commands of one pass, on a connection the caller holds; ``notify`` (when
    given) tells the job's user of each warning and action."""

    def __init__(self, settings: ActionSettings, notify: Notify | None = None) -> None:
        self.settings = settings
        self.notify = notify
        self.rules = sorted({policy.rule for policy in settings.policies})
        self._refused: set[tuple[str, str]] = set()
        """(cluster, job) whose id was refused, logged once each."""

    def act_once(self, conn: psycopg.Connection[dict[str, Any]]) -> ActionPass:
        result = ActionPass()
        if not self.settings.policies:
            return result
        now: dt.datetime = conn.execute("SELECT now() AS now").fetchone()["now"]  # type: ignore[index]
        recent = dt.timedelta(seconds=max(self.settings.stale_after_s, 3600))
        rows = self._slurm_jobs(conn.execute(_CANDIDATES, {"now": now, "recent": recent, "rules": self.rules,
                                                           "clusters": self.settings.clusters}).fetchall())
        clusters = sorted({row["cluster"] for row in rows})
        if not self.settings.clusters and len(clusters) > 1:
            # scancel takes a job number, and each cluster has its own: job 1234 of another cluster is
            # someone else's job here. Acting on none is the only safe answer until the site says which.
            log.error("actions: idle jobs of %d clusters (%s) and JOBSIGHT_ACTIONS_CLUSTERS unset: acting on "
                      "none; list the clusters this host's Slurm runs", len(clusters), ", ".join(clusters[:5]))
            return result
        done = self._done(conn, [r["finding_id"] for r in rows])
        acted = int(conn.execute(_ACTED_LAST_HOUR, {"now": now}).fetchone()["n"])  # type: ignore[index]
        stale = dt.timedelta(seconds=self.settings.stale_after_s)
        for row in rows:
            candidate = _candidate(row)
            for policy in self.settings.policies:
                step = due_step(policy, candidate, done.get((candidate.finding_id, policy.name), set()), now, stale)
                if step is None:
                    continue
                acts = step == ACT and not policy.dry_run and policy.action != "notify-only"
                if acts and acted >= self.settings.max_actions_per_hour:
                    outcome, detail = "held_back", f"over the cap of {self.settings.max_actions_per_hour} an hour"
                elif acts:
                    acted += 1
                    outcome, detail = self._act(conn, row, policy, candidate, now)
                else:
                    outcome, detail = "recorded", _detail(policy, candidate, step, now)
                with conn.transaction():  # the step and its notice together, or neither
                    self._record(conn, row, policy, step, now, outcome, detail)
                    if self.notify is not None and outcome in ("recorded", "done"):
                        self.notify.step(conn, row, policy, step, now, detail)
                result.steps.append((candidate.job.job_id, policy.name, step, outcome))
        return result

    def _slurm_jobs(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rows whose job id is a Slurm job's: any other (a run outside Slurm, a corrupted row's
        ``--user=alice``) gets no step, and is logged once per process (a warning when it is no job id at
        all: only a row written around the wire's check holds one)."""
        kept = []
        for row in rows:
            key = (row["cluster"], row["job_id"])
            if is_slurm_job_id(row["job_id"]):
                kept.append(row)
            elif key not in self._refused:
                if len(self._refused) >= _REFUSED_KEPT:
                    self._refused.clear()
                self._refused.add(key)
                log.log(logging.INFO if is_job_id(row["job_id"]) else logging.WARNING,
                        "actions: job %r of cluster %r is not a Slurm job id: no policy acts on it",
                        row["job_id"][:140], row["cluster"][:140])
        return kept

    def _done(self, conn: psycopg.Connection[dict[str, Any]],
              findings: Sequence[int]) -> dict[tuple[int, str], set[str]]:
        done: dict[tuple[int, str], set[str]] = {}
        for r in conn.execute(_DONE, {"findings": list(findings), "retried": list(RETRIED)}).fetchall():
            done.setdefault((r["finding_id"], r["policy"]), set()).add(r["step"])
        return done

    def _record(self, conn: psycopg.Connection[dict[str, Any]], row: dict[str, Any], policy: Policy, step: str,
                now: dt.datetime, outcome: str, detail: str) -> None:
        conn.execute(_RECORD, {
            "cluster": row["cluster"], "job_id": row["job_id"], "finding_id": row["finding_id"],
            "policy": policy.name, "rule": policy.rule, "step": step, "at": now, "dry_run": policy.dry_run,
            "outcome": outcome, "detail": detail, "retried": list(RETRIED),
            "evidence": Jsonb({"finding": row["evidence"], "opened_at": row["opened_at"].isoformat(),
                               "last_sample_at": row["last_sample_at"].isoformat() if row["last_sample_at"] else None,
                               "action": policy.action}),
        })

    def _act(self, conn: psycopg.Connection[dict[str, Any]], row: dict[str, Any], policy: Policy,
             candidate: Candidate, now: dt.datetime) -> tuple[str, str]:
        """Record the action as pending, then run it; its outcome and what Slurm said."""
        said = reason(policy, candidate, now)
        self._record(conn, row, policy, ACT, now, "pending", said)
        job = candidate.job.job_id
        timeout = self.settings.command_timeout_s
        self._comment(job, said)
        try:
            if policy.action == "cancel":
                cancel_job(self.settings.scancel, job, timeout)
            else:
                requeue_job(self.settings.scontrol, job, timeout)
        except SlurmCommandError as exc:
            return "failed", f"{said}; {exc}"
        log.info("actions: %s job %r (%s)", "cancelled" if policy.action == "cancel" else "requeued", job, said)
        if policy.action == "cancel":
            # Slurm's end state stays Slurm's (the epilog and reconciliation write CANCELLED); this says why.
            conn.execute(_END_REASON, {"reason": said, "job_id": job, "cluster": row["cluster"]})
        return "done", said

    def _comment(self, job: str, said: str) -> None:
        """Add the reason after the site's ``AdminComment``, where `scontrol show job` and sacct show it.
        Unread, it is left alone (writing would replace what the site keeps there); a failure here does
        not stop the action (an old Slurm, a field this site has turned off)."""
        timeout = self.settings.command_timeout_s
        try:
            comment = appended_comment(read_admin_comment(self.settings.squeue, job, timeout), said)
            if comment is None:
                log.info("actions: job %r's AdminComment holds the reason already or has no room for it", job)
                return
            write_admin_comment(self.settings.scontrol, job, comment, timeout)
        except SlurmCommandError as exc:
            log.warning("actions: could not add the reason to job %r's AdminComment: %s", job, exc)


def _detail(policy: Policy, candidate: Candidate, step: str, now: dt.datetime) -> str:
    """What a recorded step says: why the job is exempt, or the reason the ladder gives."""
    return (exemption(policy, candidate.job) or "") if step == EXEMPT else reason(policy, candidate, now)


def _candidate(row: dict[str, Any]) -> Candidate:
    facts = JobFacts(job_id=row["job_id"], user=row["user_name"], account=row["account"], partition=row["partition"],
                     name=row["name"], qos=row["qos"], comment=row["comment"], batch=row["batch"],
                     time_limit_s=row["time_limit_s"])
    return Candidate(row["finding_id"], row["rule"], row["opened_at"], row["last_sample_at"], facts,
                     idle_since(row["evidence"], row["opened_at"]))


class ActionTimer(LeaderTimer[ActionPass]):
    """The timer: acts while this process leads (:data:`ACTIONS_LOCK_KEY`)."""

    def __init__(self, database_url: str, settings: ActionSettings, notify: Notify | None = None) -> None:
        super().__init__(database_url, ACTIONS_LOCK_KEY, "actions", settings.interval_s)
        self.actions = WasteActions(settings, notify)

    def work(self, conn: psycopg.Connection[dict[str, Any]]) -> ActionPass:
        return self.actions.act_once(conn)

    def describe(self, result: ActionPass) -> str | None:
        if not result.steps:
            return None
        outcomes = sorted({outcome for *_, outcome in result.steps})
        return ", ".join(f"{result.count(outcome)} {outcome}" for outcome in outcomes)
