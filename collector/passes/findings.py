"""The health evaluator: reads running jobs' rollups, applies :mod:`jobsight.rules.health`,
and keeps ``findings`` (and the alert outbox) in step with what the rules say.

One collector process evaluates at a time, whatever ``--workers`` is: :class:`Evaluator` holds a
session advisory lock on a connection of its own while it leads; the others try again each
interval and take over when the leader's connection goes. An evaluation:

* reads the running jobs, their ranks' minute step sums (``step_minutes``) over the recent
  window, and their GPUs' minute sums over the idle and low-utilisation windows from both tiers
  (``gpu_minutes`` and the packed ``gpu_minute_blocks`` of the hours the windows reach):
  rollups, so 500 running jobs of 8 GPUs are ~250 k small rows, not every sample;
* for a rank silent past the window (hung), reads its last few minutes to know its usual step;
* for a job with a rank silent past ``hung_min_s``, reads its ranks' latest run events since:
  which said they are done (not hung), and where each stays inside its pending step (the agent's
  phase reports, ``jobsight.protocol.step_phases``), so a hung job names the rank the others wait for;
* opens a finding once (the partial unique index on open findings), updates its evidence while
  it lasts, resolves it when the rule no longer fires or the job ends;
* for a job where a straggler or hung-rank rule fires, reads its hardware over the straggler window
  (``collector/query/job_hardware.py``: GPU clocks, throttle reasons, error counters, Xids, host
  CPU, which GPU each rank uses) and judges it again, so the finding says the cause;
* writes each finding's alerts in the transaction that opens or resolves it (collector/passes/alerts.py);
* every ``suspect_interval_s``, alerts the GPUs that hurt too many jobs (collector/passes/suspects.py).

``memory_unused`` is a verdict on a whole run: it is written when a job the evaluator saw running
has ended, already resolved at the job's end, and alerted once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from psycopg.types.json import Jsonb

from jobsight.collector.config.alerts import AlertSettings
from jobsight.collector.config.health import HealthSettings
from jobsight.collector.passes.leader import LeaderTimer
from jobsight.collector.passes.suspects import alert_suspects
from jobsight.collector.query.job_hardware import gpu_name, read_job_hardware
from jobsight.collector.store.db import Connection
from jobsight.collector.tiers.reads import gpu_minutes_of
from jobsight.collector.tiers.step_rollup import NO_RANK
from jobsight.protocol.run_events import END_EVENTS
from jobsight.protocol.step_phases import PHASE_EVENT, PendingPhase, parse
from jobsight.rules.hardware_cause import XID_BEFORE_S
from jobsight.rules.health import (
    IDLE_SINCE,
    Finding,
    GpuWindow,
    HealthThresholds,
    JobHealthInput,
    RankSteps,
    evaluate,
)
from jobsight.rules.rule_names import EXPLAINED_RULES, HUNG_RANK, LIVE_RULES, MEMORY_UNUSED, STRAGGLER

log = logging.getLogger("jobsight.collector.passes.findings")

HEALTH_LOCK_KEY: Final = 0x6A6F6273_68656C74 & 0x7FFFFFFFFFFFFFFF
"""Session advisory lock held by the one evaluating process."""
KEPT_EVIDENCE: Final = (IDLE_SINCE,)
"""Evidence a finding keeps from its opening while it is updated: when the stretch it judges began
(the actions pass counts the idle time of a cancel's reason from it)."""
STRAGGLER_HUNG: Final = "It has since stopped stepping: see the hung finding."
"""Said by a straggler finding kept open while its rank is hung."""

JobKey = tuple[str, str]
"""cluster, job_id."""
Enqueue = Callable[[Connection, Mapping[str, Any], str, Mapping[str, Any]], int]
"""Writes the alerts of one finding event (opened/resolved) in the caller's transaction."""


def _ts(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


def _s(value: dt.datetime) -> float:
    return value.timestamp()


def _opt_s(value: dt.datetime | None) -> float | None:
    return None if value is None else value.timestamp()


_RUNNING = """
SELECT cluster, job_id, user_name, account, partition, start_time, last_seen
FROM jobs WHERE state = 'running' AND last_seen >= %(alive)s
"""

# Named ranks only: steps recorded without a rank (NO_RANK) name no process, so no rank rule judges
# them (a finished run outside Slurm was once called hung, blaming "rank -1").
_STEP_WINDOW = f"""
SELECT cluster, job_id, rank, max(last_ts) AS last_ts,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_sum / steps) AS median_step,
       sum(steps) FILTER (WHERE last_ts >= %(window_from)s) AS w_steps,
       sum(duration_sum) FILTER (WHERE last_ts >= %(window_from)s) AS w_duration,
       sum(coalesce(data_wait_sum, 0) + forward_sum) FILTER (WHERE last_ts >= %(window_from)s) AS w_own,
       sum(data_wait_sum) FILTER (WHERE last_ts >= %(window_from)s) AS w_wait,
       bool_and(forward_n IS NOT NULL AND forward_n = steps) FILTER (WHERE last_ts >= %(window_from)s) AS w_all_forward
FROM step_minutes
WHERE job_id = ANY(%(jobs)s) AND ts >= %(since)s AND rank > {NO_RANK}
GROUP BY cluster, job_id, rank
"""

# A rank silent past the window: its latest minutes, for its last step and usual step time.
_SILENT_RANKS = """
SELECT k.cluster, k.job_id, k.rank, x.last_ts, x.median_step
FROM unnest(%(clusters)s::text[], %(jobs)s::text[], %(ranks)s::int[]) AS k(cluster, job_id, rank),
LATERAL (
    SELECT max(r.last_ts) AS last_ts, percentile_cont(0.5) WITHIN GROUP (ORDER BY r.step_s) AS median_step
    FROM (SELECT s.last_ts, s.duration_sum / s.steps AS step_s FROM step_minutes s
          WHERE s.job_id = k.job_id AND s.cluster = k.cluster AND s.rank = k.rank
          ORDER BY s.ts DESC LIMIT 10) r
) x
WHERE x.last_ts IS NOT NULL
"""

# Each rank's latest event of each kind after the given time (the silent ranks' earliest last
# step): an end event says its process is done; a phase report says where it stays in its step.
# One row per rank and kind, however many a job sent.
_RANK_EVENTS = """
SELECT DISTINCT ON (coalesce(rank, -1), attrs->>'event') coalesce(rank, -1) AS rank, attrs->>'event' AS event,
       attrs
FROM log_events
WHERE job_id = %(job)s AND cluster = %(cluster)s AND ts >= %(since)s AND attrs->>'event' = ANY(%(events)s)
ORDER BY coalesce(rank, -1), attrs->>'event', ts DESC
"""

_RANKS_EVER = (f"SELECT DISTINCT rank FROM step_minutes WHERE job_id = %(job)s AND cluster = %(cluster)s "
               f"AND rank > {NO_RANK}")

# The GPUs of the jobs (from the hourly rollup: a few rows each), then each GPU's minutes over
# the windows from both tiers (collector/tiers/reads.py): the hot rows through the minute rollup's key
# index, and the packed blocks of the (one or two) closed hours the windows reach, unpacked for that GPU
# alone. Hourly packing moves a window's older minutes out of the hot table: a read of it alone would
# judge the last minutes since the top of the hour, and close every idle finding once an hour.
_WINDOW_MINUTES = ("first_ts", "last_ts", "util_gpu_max", "util_gpu_sum", "util_gpu_n", "power_sum", "power_n")
_GPU_WINDOW = f"""
WITH g AS (
    SELECT DISTINCT cluster, job_id, node, gpu_index, mig_uuid FROM gpu_hours
    WHERE job_id = ANY(%(jobs)s) AND ts >= date_trunc('hour', %(since)s::timestamptz)
)
SELECT g.cluster, g.job_id, g.node, g.gpu_index, g.mig_uuid, w.*
FROM g, LATERAL (
    SELECT min(m.first_ts) AS first_ts, max(m.last_ts) AS last_ts,
           max(m.util_gpu_max) FILTER (WHERE m.last_ts >= %(idle)s) AS idle_max,
           min(m.first_ts) FILTER (WHERE m.last_ts >= %(idle)s) AS idle_first,
           sum(m.util_gpu_sum) FILTER (WHERE m.last_ts >= %(low)s) AS low_sum,
           sum(m.util_gpu_n) FILTER (WHERE m.last_ts >= %(low)s) AS low_n,
           min(m.first_ts) FILTER (WHERE m.last_ts >= %(low)s) AS low_first,
           sum(m.util_gpu_sum) FILTER (WHERE m.last_ts >= %(recent)s)
               / nullif(sum(m.util_gpu_n) FILTER (WHERE m.last_ts >= %(recent)s), 0) AS util_recent,
           sum(m.power_sum) FILTER (WHERE m.last_ts >= %(recent)s)
               / nullif(sum(m.power_n) FILTER (WHERE m.last_ts >= %(recent)s), 0) AS power_recent
    FROM {gpu_minutes_of(_WINDOW_MINUTES, job="g.job_id", cluster="g.cluster", node="g.node",
                         gpu_index="g.gpu_index", mig_uuid="g.mig_uuid",
                         start="date_bin('1 minute', %(since)s::timestamptz, TIMESTAMPTZ '2000-01-01')")} m
) w
WHERE w.first_ts IS NOT NULL
"""

_MEMORY_PEAKS = """
SELECT cluster, job_id, node, gpu_index, mig_uuid, max(mem_used_max) AS used, max(mem_total_max) AS total
FROM gpu_hours WHERE job_id = ANY(%(jobs)s)
GROUP BY cluster, job_id, node, gpu_index, mig_uuid
"""

_OPEN = "SELECT * FROM findings WHERE state = 'open'"

_INSERT = """
INSERT INTO findings (cluster, job_id, rule, subject, rank, node, gpu, severity, state, opened_at, updated_at,
                      resolved_at, at_ts, title, message, evidence)
VALUES (%(cluster)s, %(job_id)s, %(rule)s, %(subject)s, %(rank)s, %(node)s, %(gpu)s, %(severity)s, %(state)s,
        %(now)s, %(now)s, %(resolved_at)s, %(at_ts)s, %(title)s, %(message)s, %(evidence)s)
ON CONFLICT (job_id, cluster, rule, subject) WHERE state = 'open' DO NOTHING
RETURNING *
"""

_UPDATE = """
UPDATE findings SET severity = %(severity)s, updated_at = %(now)s, at_ts = %(at_ts)s, title = %(title)s,
       message = %(message)s, evidence = %(evidence)s, rank = %(rank)s, node = %(node)s, gpu = %(gpu)s
WHERE job_id = %(job_id)s AND id = %(id)s AND state = 'open'
"""

_RESOLVE = """
UPDATE findings SET state = 'resolved', resolved_at = %(now)s, updated_at = %(now)s
WHERE job_id = %(job_id)s AND id = %(id)s AND state = 'open'
RETURNING *
"""

_JOB_FACTS = "SELECT user_name, account, partition, state, end_time FROM jobs WHERE job_id = %s AND cluster = %s"


def _kept_evidence(new: Mapping[str, Any], old: Any) -> dict[str, Any]:
    """``new`` with the values of :data:`KEPT_EVIDENCE` that the finding opened with."""
    kept = {k: old[k] for k in KEPT_EVIDENCE if isinstance(old, Mapping) and k in old}
    return {**new, **kept}


def _hung_ranks(found: Iterable[Finding]) -> set[int]:
    """The ranks a hung finding among ``found`` names as stuck: its own rank, or those the others
    wait for (a job-level finding that cannot tell names none)."""
    out: set[int] = set()
    for f in found:
        if f.rule == HUNG_RANK:
            out.update([f.rank] if f.rank is not None else [])
            out.update(r for r in f.evidence.get("behind", ()) if isinstance(r, int))
    return out


@dataclass
class Evaluation:
    """What one evaluation did, for logs, tests and the bench."""

    jobs: int = 0
    opened: list[dict[str, Any]] = field(default_factory=list)
    updated: int = 0
    resolved: list[dict[str, Any]] = field(default_factory=list)


def _pending(rank: RankSteps, phase: PendingPhase | None) -> RankSteps:
    """``rank`` with ``phase`` when it is about the step after its last one: a report from before
    its last step is over (the rank stepped on since). Times on the wire are whole microseconds, each
    rounded on its own way there: a millisecond's slack keeps the report that begins as that step ends."""
    if phase is None or phase.since < rank.last_step_at - 1e-3:
        return rank
    return dataclasses.replace(rank, pending=phase)


class HealthEvaluator:
    """The rules over the stored rollups; state kept between evaluations is only a cache (the
    ranks each running job has had), so a new leader starts from the database alone."""

    def __init__(self, settings: HealthSettings, enqueue: Enqueue | None = None,
                 alerts: AlertSettings | None = None) -> None:
        self.settings = settings
        self.alerts = alerts
        self._suspects_at = float("-inf")
        self.thresholds: HealthThresholds = settings.thresholds()
        self._enqueue = enqueue
        self._ranks: dict[JobKey, set[int]] = {}
        self._running: dict[JobKey, dict[str, Any]] = {}

    # -- reading ---------------------------------------------------------------------------------

    def _ranks_ever(self, conn: Connection, key: JobKey) -> set[int]:
        known = self._ranks.get(key)
        if known is None:
            rows = conn.execute(_RANKS_EVER, {"job": key[1], "cluster": key[0]}).fetchall()
            known = self._ranks[key] = {int(r["rank"]) for r in rows}
        return known

    def _rank_steps(self, conn: Connection, jobs: Sequence[JobKey], now: float) -> dict[JobKey, list[RankSteps]]:
        t = self.thresholds
        since = now - max(t.straggler_window_s, t.hung_min_s) - 60
        params = {"jobs": [j for _, j in jobs], "since": _ts(since), "window_from": _ts(now - t.straggler_window_s)}
        wanted = set(jobs)
        out: dict[JobKey, list[RankSteps]] = {}
        for row in conn.execute(_STEP_WINDOW, params):
            key = (row["cluster"], row["job_id"])
            if key not in wanted:
                continue
            self._ranks.setdefault(key, set()).add(int(row["rank"]))
            w_steps = int(row["w_steps"] or 0)
            out.setdefault(key, []).append(RankSteps(
                int(row["rank"]), _s(row["last_ts"]), float(row["median_step"]), w_steps,
                float(row["w_duration"]) / w_steps if w_steps else None,
                float(row["w_own"]) / w_steps if w_steps and row["w_all_forward"] and row["w_own"] is not None
                else None,
                float(row["w_wait"]) / w_steps if w_steps and row["w_wait"] is not None else None,
            ))
        silent = [
            (key, rank) for key in jobs for rank in self._ranks_ever(conn, key)
            if rank not in {r.rank for r in out.get(key, [])}
        ]
        if silent:
            rows = conn.execute(_SILENT_RANKS, {
                "clusters": [k[0] for k, _ in silent], "jobs": [k[1] for k, _ in silent],
                "ranks": [r for _, r in silent],
            })
            for row in rows:
                out.setdefault((row["cluster"], row["job_id"]), []).append(
                    RankSteps(int(row["rank"]), _s(row["last_ts"]), float(row["median_step"])))
        return {key: self._still_running(conn, key, ranks, now) for key, ranks in out.items()}

    def _still_running(self, conn: Connection, key: JobKey, ranks: list[RankSteps], now: float) -> list[RankSteps]:
        """``ranks`` less those whose process said it was done after its last step, each with the
        phase it said it stays in since then. Read only for jobs with a rank silent past
        ``hung_min_s``: the others cannot be hung."""
        silent = [r for r in ranks if now - r.last_step_at > self.thresholds.hung_min_s]
        if not silent:
            return ranks
        rows = conn.execute(_RANK_EVENTS, {"job": key[1], "cluster": key[0], "events": [*END_EVENTS, PHASE_EVENT],
                                           "since": _ts(min(r.last_step_at for r in silent))})
        done: set[int] = set()
        phases: dict[int, PendingPhase] = {}
        for row in rows:
            rank = int(row["rank"])
            if row["event"] in END_EVENTS:
                done.add(rank)
            elif (phase := parse(row["attrs"])) is not None:
                phases[rank] = phase
        return [_pending(r, phases.get(r.rank)) for r in ranks if r.rank not in done]

    def _gpu_windows(self, conn: Connection, jobs: Sequence[JobKey], now: float) -> dict[JobKey, list[GpuWindow]]:
        t = self.thresholds
        # A minute more than the windows: the rules ask whether a GPU has samples as old as their
        # window's start, and the minute the start falls in may have none before it (its first
        # sample comes later in the minute): that GPU would never look covered.
        params = {
            "jobs": [j for _, j in jobs], "since": _ts(now - max(t.idle_min_s, t.low_util_window_s) - 60),
            "idle": _ts(now - t.idle_min_s), "low": _ts(now - t.low_util_window_s), "recent": _ts(now - 300),
        }
        wanted = set(jobs)
        out: dict[JobKey, list[GpuWindow]] = {}
        for row in conn.execute(_GPU_WINDOW, params):
            key = (row["cluster"], row["job_id"])
            if key not in wanted:
                continue
            out.setdefault(key, []).append(GpuWindow(
                gpu_name(row["node"], row["gpu_index"], row["mig_uuid"]), row["node"] or None,
                _s(row["first_ts"]), _s(row["last_ts"]),
                None if row["idle_max"] is None else float(row["idle_max"]),
                float(row["low_sum"] or 0.0), int(row["low_n"] or 0),
                None if row["power_recent"] is None else float(row["power_recent"]),
                None if row["util_recent"] is None else float(row["util_recent"]),
                _opt_s(row["idle_first"]), _opt_s(row["low_first"]),
            ))
        return out

    def inputs(self, conn: Connection, now: float) -> tuple[dict[JobKey, dict[str, Any]], dict[JobKey, JobHealthInput]]:
        """The running jobs (rows by key) and what the rules read of each."""
        alive = _ts(now - self.settings.gone_after_s)
        running = {(r["cluster"], r["job_id"]): r for r in conn.execute(_RUNNING, {"alive": alive})}
        keys = sorted(running)
        steps = self._rank_steps(conn, keys, now) if keys else {}
        gpus = self._gpu_windows(conn, keys, now) if keys else {}
        for gone in set(self._ranks) - set(running):
            del self._ranks[gone]
        return running, {
            key: JobHealthInput(key[1], now, True, steps.get(key, []), gpus.get(key, [])) for key in keys
        }

    def _with_hardware(self, conn: Connection, key: JobKey, job: JobHealthInput) -> JobHealthInput:
        """``job`` with its hardware over the straggler window, and its Xids from a while before
        its earliest last step (a fault may come a little before a rank stops)."""
        start = job.now - self.thresholds.straggler_window_s
        last = min((r.last_step_at for r in job.ranks), default=start)
        hardware = read_job_hardware(conn, key[0], key[1], start, job.now, min(start, last - XID_BEFORE_S))
        return dataclasses.replace(job, hardware=hardware)

    # -- writing ---------------------------------------------------------------------------------

    def _alert(self, conn: Connection, finding: Mapping[str, Any], event: str, job: Mapping[str, Any]) -> None:
        if self._enqueue is not None:
            self._enqueue(conn, finding, event, job)

    def _open(self, conn: Connection, key: JobKey, f: Finding, now: float, job: Mapping[str, Any],
              state: str = "open", resolved_at: dt.datetime | None = None) -> dict[str, Any] | None:
        row = conn.execute(_INSERT, {
            "cluster": key[0], "job_id": key[1], "rule": f.rule, "subject": f.subject, "rank": f.rank, "node": f.node,
            "gpu": f.gpu, "severity": f.severity, "state": state, "now": _ts(now), "resolved_at": resolved_at,
            "at_ts": None if f.at is None else _ts(f.at), "title": f.title, "message": f.message,
            "evidence": Jsonb(f.evidence),
        }).fetchone()
        if row is not None:
            self._alert(conn, row, "opened", job)
        return row

    def _apply(self, conn: Connection, key: JobKey, found: Iterable[Finding], open_rows: Mapping[tuple[str, str], Any],
               now: float, job: Mapping[str, Any], result: Evaluation) -> None:
        """Make the job's open findings what the rules found, in one transaction."""
        seen: set[tuple[str, str]] = set()
        with conn.transaction():
            for f in found:
                seen.add((f.rule, f.subject))
                existing = open_rows.get((f.rule, f.subject))
                if existing is None:
                    row = self._open(conn, key, f, now, job)
                    if row is not None:
                        result.opened.append(row)
                    continue
                self._update(conn, existing, f, now)
                result.updated += 1
            held = _hung_ranks(found)
            for (rule, subject), existing in open_rows.items():
                if (rule, subject) in seen:
                    continue
                if rule == STRAGGLER and existing["rank"] in held:
                    self._keep_straggler(conn, existing, now)
                    result.updated += 1
                else:
                    self._resolve(conn, existing, now, job, result)

    def _update(self, conn: Connection, existing: Mapping[str, Any], f: Finding, now: float) -> None:
        """``existing`` saying what ``f`` says, but for the evidence it keeps from its opening."""
        conn.execute(_UPDATE, {
            "job_id": existing["job_id"], "id": existing["id"], "severity": f.severity, "now": _ts(now),
            "at_ts": None if f.at is None else _ts(f.at), "title": f.title, "message": f.message,
            "evidence": Jsonb(_kept_evidence(f.evidence, existing["evidence"])), "rank": f.rank, "node": f.node,
            "gpu": f.gpu,
        })

    def _keep_straggler(self, conn: Connection, existing: Mapping[str, Any], now: float) -> None:
        """A straggler whose rank is now hung stays open, saying so: it did not recover, and its
        resolve alert would say it had. It is judged again once the hung finding goes."""
        message = existing["message"]
        if not message.endswith(STRAGGLER_HUNG):
            message = f"{message} {STRAGGLER_HUNG}"
        conn.execute(_UPDATE, {
            "job_id": existing["job_id"], "id": existing["id"], "severity": existing["severity"], "now": _ts(now),
            "at_ts": existing["at_ts"], "title": existing["title"], "message": message,
            "evidence": Jsonb({**(existing["evidence"] or {}), "hung": True}), "rank": existing["rank"],
            "node": existing["node"], "gpu": existing["gpu"],
        })

    def _resolve(self, conn: Connection, existing: Mapping[str, Any], now: float, job: Mapping[str, Any],
                 result: Evaluation) -> None:
        row = conn.execute(_RESOLVE, {"job_id": existing["job_id"], "id": existing["id"], "now": _ts(now)}).fetchone()
        if row is not None:
            self._alert(conn, row, "resolved", job)
            result.resolved.append(row)

    def _ended(self, conn: Connection, open_by_job: Mapping[JobKey, Mapping[tuple[str, str], Any]],
               running: Mapping[JobKey, Any], now: float, result: Evaluation) -> None:
        """Resolve the open findings of jobs that no longer run; judge the memory of those that
        this evaluator saw running."""
        ended = (set(open_by_job) | set(self._running)) - set(running)
        if not ended:
            return
        peaks = self._memory_peaks(conn, [k for k in ended if k in self._running])
        for key in sorted(ended):
            facts = conn.execute(_JOB_FACTS, (key[1], key[0])).fetchone() or {}
            with conn.transaction():
                for existing in open_by_job.get(key, {}).values():
                    self._resolve(conn, existing, now, facts, result)
                judged = MEMORY_UNUSED in self.settings.rules and facts.get("state") not in (None, "running")
                if key in peaks and judged:
                    job = JobHealthInput(key[1], now, running=False, memory_peaks=peaks[key])
                    end = facts.get("end_time") or _ts(now)
                    for f in evaluate(job, self.thresholds, (MEMORY_UNUSED,)):
                        row = self._open(conn, key, f, now, facts, state="resolved", resolved_at=end)
                        if row is not None:
                            result.opened.append(row)

    def _memory_peaks(self, conn: Connection, jobs: Sequence[JobKey]) -> dict[JobKey, dict[str, tuple[int, int]]]:
        out: dict[JobKey, dict[str, tuple[int, int]]] = {}
        if not jobs:
            return out
        wanted = set(jobs)
        for row in conn.execute(_MEMORY_PEAKS, {"jobs": [j for _, j in jobs]}):
            key = (row["cluster"], row["job_id"])
            if key in wanted and row["used"] is not None and row["total"]:
                out.setdefault(key, {})[gpu_name(row["node"], row["gpu_index"], row["mig_uuid"])] = (
                    int(row["used"]), int(row["total"]))
        return out

    def evaluate_once(self, conn: Connection, now: float | None = None) -> Evaluation:
        """One evaluation of every running job (``conn`` in autocommit mode, rows as dicts)."""
        now = time.time() if now is None else now
        result = Evaluation()
        running, inputs = self.inputs(conn, now)
        open_by_job: dict[JobKey, dict[tuple[str, str], Any]] = {}
        for row in conn.execute(_OPEN):
            open_by_job.setdefault((row["cluster"], row["job_id"]), {})[(row["rule"], row["subject"])] = row
        rules = [r for r in self.settings.rules if r in LIVE_RULES]
        for key, job in inputs.items():
            found = evaluate(job, self.thresholds, rules)
            if any(f.rule in EXPLAINED_RULES for f in found):
                found = evaluate(self._with_hardware(conn, key, job), self.thresholds, rules)
            self._apply(conn, key, found, open_by_job.get(key, {}), now, running[key], result)
        self._ended(conn, open_by_job, running, now, result)
        self._running = dict(running)
        if self.alerts is not None and now - self._suspects_at >= self.settings.suspect_interval_s:
            self._suspects_at = now
            alert_suspects(conn, self.settings, self.alerts, now)
        result.jobs = len(inputs)
        return result


class Evaluator(LeaderTimer[Evaluation]):
    """The health timer: evaluates while this process leads (:data:`HEALTH_LOCK_KEY`)."""

    def __init__(self, database_url: str, settings: HealthSettings, enqueue: Enqueue | None = None,
                 alerts: AlertSettings | None = None) -> None:
        super().__init__(database_url, HEALTH_LOCK_KEY, "health", settings.interval_s)
        self.settings = settings
        self.health = HealthEvaluator(settings, enqueue, alerts)

    def work(self, conn: Connection) -> Evaluation:
        return self.health.evaluate_once(conn)

    def describe(self, result: Evaluation) -> str | None:
        if not (result.opened or result.resolved):
            return None
        return f"{result.jobs} running jobs, {len(result.opened)} findings opened, {len(result.resolved)} resolved"
