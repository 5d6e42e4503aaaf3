"""GPUs that keep hurting jobs: across the jobs of a period, each GPU's Xid errors, the error
counters and memory flags its jobs' summaries recorded, and the straggler and hung findings whose
cause was that GPU, with the jobs each touched.

Three small sources, none of them samples: ``gpu_events`` (Xids, a few rows), the summaries of the
jobs that ended in the period (``gpus[].faults``, collector/jobs/gpu_faults.py) and the findings
(``evidence.cause``, jobsight/rules/hardware_cause.py). Only what the node daemon wrote
reaches the first two for a Slurm job (collector/ingest/self_reported.py); a run outside Slurm
speaks for its own GPUs, so its rows are counted but marked (``self_reported``).

A suspect gets a suggested drain line for the admin to run, and only one that hurt at least the site's
``suspect_alert_jobs`` distinct jobs (collector/config/health.py, 3 by default) in the period: one
failed job is as likely the job's doing (or bad luck) as the GPU's, and a drain takes a node from
everyone. A GPU under that count is worth watching, and said so (:meth:`SuspectGpu.drain_suggestion`).
The distinct users of its jobs are counted and shown (``users``), so an admin sees a GPU that only
one user's jobs found wanting. jobsight never drains by itself.
"""

from __future__ import annotations

import datetime as dt
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from jobsight.collector.store.db import Connection
from jobsight.rules.hardware_cause import xid_text
from jobsight.rules.rule_names import EXPLAINED_RULES

APPLICATION_XIDS: Final = frozenset({13, 31, 43, 45})
"""Xids an application's own error raises (a bad kernel, a page fault): not held against a GPU."""
HARDWARE_CAUSES: Final = ("clocks", "xid", "gpu_lost", "links")
"""Finding causes that are the GPU's doing (not the host's, the data's, or nothing)."""
_NODE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
"""A node name fit for a suggested command line: a Slurm host name, nothing a shell reads."""

_XIDS: Final = """
SELECT e.cluster, e.node, e.gpu_index, max(e.gpu_uuid) AS gpu_uuid, e.code, e.job_id, count(*) AS n,
       min(e.ts) AS first_at, max(e.ts) AS last_at, bool_or(j.user_name IS NULL) AS self_reported,
       max(j.user_name) AS user_name
FROM gpu_events e LEFT JOIN jobs j ON j.cluster = e.cluster AND j.job_id = e.job_id
WHERE e.ts >= %(since)s AND e.ts <= %(until)s AND e.event = 'xid'
  AND (%(cluster)s::text IS NULL OR e.cluster = %(cluster)s)
GROUP BY e.cluster, e.node, e.gpu_index, e.code, e.job_id
"""

_FAULTS: Final = """
SELECT s.cluster, s.job_id, g->>'node' AS node, (g->>'gpu_index')::int AS gpu_index, g->>'gpu_uuid' AS gpu_uuid,
       g->'faults' AS faults, j.end_time AS at, j.user_name IS NULL AS self_reported, j.user_name
FROM job_summaries s JOIN jobs j ON j.cluster = s.cluster AND j.job_id = s.job_id,
     jsonb_array_elements(s.summary->'gpus') g
WHERE j.end_time >= %(since)s AND j.end_time <= %(until)s AND g ? 'faults'
  AND (%(cluster)s::text IS NULL OR s.cluster = %(cluster)s)
"""

_FINDINGS: Final = """
SELECT f.cluster, f.job_id, f.gpu, f.rule, f.evidence->'cause'->>'kind' AS cause, f.opened_at AS at, j.user_name
FROM findings f LEFT JOIN jobs j ON j.cluster = f.cluster AND j.job_id = f.job_id
WHERE f.opened_at >= %(since)s AND f.opened_at <= %(until)s AND f.rule = ANY(%(explained)s)
  AND f.gpu IS NOT NULL AND f.evidence->'cause'->>'kind' = ANY(%(causes)s)
  AND (%(cluster)s::text IS NULL OR f.cluster = %(cluster)s)
"""


@dataclass
class SuspectGpu:
    cluster: str
    node: str | None
    gpu_index: int
    gpu_uuid: str | None = None
    xids: dict[int, int] = field(default_factory=dict)
    """Hardware Xid code → how many."""
    faults: dict[str, int] = field(default_factory=dict)
    """Counter → its rise summed over the jobs; flag → how many jobs ended with it set."""
    findings: dict[str, int] = field(default_factory=dict)
    """Rule → findings whose cause was this GPU."""
    jobs: set[str] = field(default_factory=set)
    users: set[str] = field(default_factory=set)
    """The users of those jobs that a prolog named (a run outside Slurm has none)."""
    last_at: dt.datetime | None = None
    self_reported: bool = False
    """Some of it came from a run outside Slurm, which speaks for its own GPUs."""

    @property
    def gpu(self) -> str:
        return f"{self.node or '?'}/{self.gpu_index}"

    def what(self) -> str:
        """One line of what it did: "Xid 79 ×1, 12 nvlink_crc_errors, 2 stragglers"."""
        parts = [f"{xid_text(code)} ×{n}" for code, n in sorted(self.xids.items())]
        parts += [f"{n:,} {name}" for name, n in sorted(self.faults.items())]
        parts += [f"{n} {rule.replace('_', ' ')} finding{'s' if n > 1 else ''}"
                  for rule, n in sorted(self.findings.items())]
        return ", ".join(parts)

    def drain_line(self) -> str | None:
        """The ``scontrol`` line that would drain its node, for an admin to run; ``None`` when the
        node's name is not a plain host name (it came from records, and a line must never carry
        what a shell would read). Whether to suggest it is :meth:`drain_suggestion`'s to say."""
        if self.node is None or not _NODE.fullmatch(self.node):
            return None
        reason = f"jobsight: GPU {self.gpu_index} hurt {len(self.jobs)} jobs ({self.what()})"[:200]
        return f"scontrol update NodeName={self.node} State=DRAIN Reason={shlex.quote(reason)}"

    def worth_watching(self, min_jobs: int) -> bool:
        """Whether it hurt too few distinct jobs for a drain to be suggested: under ``min_jobs``
        (the site's ``suspect_alert_jobs``; 0: never suggested)."""
        return min_jobs <= 0 or len(self.jobs) < min_jobs

    def drain_suggestion(self, min_jobs: int) -> str | None:
        """The drain line to suggest: :meth:`drain_line` for a GPU that hurt at least ``min_jobs``
        distinct jobs; ``None`` for one that is only worth watching, or whose node's name is not a
        plain host name."""
        return None if self.worth_watching(min_jobs) else self.drain_line()

    def as_json(self, min_jobs: int) -> dict[str, Any]:
        """The API's and the page's row; ``drain`` is :meth:`drain_suggestion` at ``min_jobs``."""
        return {"cluster": self.cluster, "node": self.node, "gpu_index": self.gpu_index, "gpu": self.gpu,
                "gpu_uuid": self.gpu_uuid, "xids": {str(k): v for k, v in sorted(self.xids.items())},
                "faults": dict(sorted(self.faults.items())), "findings": dict(sorted(self.findings.items())),
                "jobs": sorted(self.jobs), "job_count": len(self.jobs), "user_count": len(self.users),
                "last_at": None if self.last_at is None else self.last_at.isoformat(),
                "self_reported": self.self_reported, "summary": self.what(),
                "drain": self.drain_suggestion(min_jobs), "drain_min_jobs": min_jobs,
                "worth_watching": self.worth_watching(min_jobs),
                "plain_node": self.node is not None and _NODE.fullmatch(self.node) is not None}


def _later(a: dt.datetime | None, b: dt.datetime | None) -> dt.datetime | None:
    return b if a is None or (b is not None and b > a) else a


def suspect_gpus(conn: Connection, since: dt.datetime, until: dt.datetime,
                 cluster: str | None = None) -> list[SuspectGpu]:
    """Every GPU with a hardware Xid, an error counter that rose, a memory flag, or a finding it
    caused in ``[since, until]``; most jobs touched first."""
    params: Mapping[str, Any] = {"since": since, "until": until, "cluster": cluster, "causes": list(HARDWARE_CAUSES),
                                  "explained": list(EXPLAINED_RULES)}
    by: dict[tuple[str, str | None, int], SuspectGpu] = {}

    def gpu(cluster_: str, node: str | None, index: int, uuid: str | None = None) -> SuspectGpu:
        key = (cluster_, node, index)
        found = by.setdefault(key, SuspectGpu(cluster_, node, index))
        found.gpu_uuid = found.gpu_uuid or uuid
        return found

    for r in conn.execute(_XIDS, params):
        if int(r["code"]) in APPLICATION_XIDS:
            continue
        g = gpu(r["cluster"], r["node"], int(r["gpu_index"]), r["gpu_uuid"])
        g.xids[int(r["code"])] = g.xids.get(int(r["code"]), 0) + int(r["n"])
        g.jobs.add(r["job_id"])
        g.users.update([r["user_name"]] if r["user_name"] else [])
        g.last_at = _later(g.last_at, r["last_at"])
        g.self_reported |= bool(r["self_reported"])
    for r in conn.execute(_FAULTS, params):
        faults = r["faults"] if isinstance(r["faults"], Mapping) else {}
        g = gpu(r["cluster"], r["node"], int(r["gpu_index"]), r["gpu_uuid"])
        for name, value in faults.items():
            if isinstance(value, bool):
                g.faults[name] = g.faults.get(name, 0) + int(value)
            elif isinstance(value, int):
                g.faults[name] = g.faults.get(name, 0) + value
        g.jobs.add(r["job_id"])
        g.users.update([r["user_name"]] if r["user_name"] else [])
        g.last_at = _later(g.last_at, r["at"])
        g.self_reported |= bool(r["self_reported"])
    for r in conn.execute(_FINDINGS, params):
        node, _, index = str(r["gpu"]).rpartition("/")
        if not index.isdigit():
            continue
        g = gpu(r["cluster"], node or None, int(index))
        g.findings[r["rule"]] = g.findings.get(r["rule"], 0) + 1
        g.jobs.add(r["job_id"])
        g.users.update([r["user_name"]] if r["user_name"] else [])
        g.last_at = _later(g.last_at, r["at"])
    return sorted(by.values(), key=lambda g: (-len(g.jobs), g.cluster, g.node or "", g.gpu_index))
