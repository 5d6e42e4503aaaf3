"""What each token may write: the rules a batch is judged by on its way in (:func:`authorize_batch`).

Who is calling (:class:`Principal`) is what :class:`jobsight.collector.api.auth.Authenticator`
found in the request's token; the api room also says what a principal may read. What it may write
is ingest's, here, so that the ingest entry (:mod:`jobsight.collector.ingest.batch`) judges a batch
without importing the api room. A refused request raises :class:`AuthError`, which the api answers
with its status (401 or 403).

* **admin** (``<data_dir>/admin_token``): everything.
* **job** (minted by the Slurm prolog with the cluster secret, :mod:`jobsight.protocol.tokens`):
  writes records whose ``job`` is its job, and only into its cluster; reads its own job. Once a
  prolog registered the job with its uid, only a token minted for that uid counts
  (:func:`check_job_owner`), and its ``gpu_sample``/``host_sample`` records are kept as
  self-reported metrics, not as the node's samples (:mod:`jobsight.collector.ingest.self_reported`).
* **node** (minted by the node daemon and the root hooks with the cluster secret):
  writes records whose ``node`` (when given) is its node, for jobs whose Slurm
  allocation holds its node, and only into its cluster; cannot read. Any record kind:
  the node daemon and the hooks replay what jobs on the node spooled while the
  collector was away, and a node's root holds the cluster secret anyway (it mints the
  job tokens), so limiting kinds would be no boundary; the node binding is.

  The allocation is what the first prolog registered (``jobs.nodes`` of a job with a
  user, see :func:`jobsight.collector.jobs.allocations.job_allocations`). Once it is known, every
  record of the job, ``job_started`` and ``job_ended`` included, needs the token's node
  in it, and a ``job_started`` may not name nodes outside it: a node cannot add itself
  (or others) to someone else's job, nor end it. While it is not known (a job the
  collector has not heard of, or has seen only through other records), records are
  accepted: the prolog's ``job_started`` may sit in a spool while the daemon's samples,
  or the epilog's ``job_ended``, arrive first after a collector outage, and refusing
  them would lose them for good; a ``job_started`` then registers the job, and must
  name an allocation that holds the token's node (every prolog's does). A node's batch is
  not refused whole for a record it may not write: that record is dropped and named in the
  answer (:class:`Refusal`), and the rest is stored, so one record of a job registered
  elsewhere cannot take the telemetry of every job on the node down with it.

A ``gpu_unallocated_use`` record (a GPU used outside any job) names no job: node tokens (their
own node's) and admins write it, job tokens never. A job token's ``job_started`` may set the
job's ``name`` and ``demo`` flag only while no prolog registered the job (a run outside Slurm
names itself); once one did, they are Slurm's. Job and admin tokens' batches are stored whole or
refused whole (403 naming the record).

Every batch is recorded in the ingest ledger under its sender (:func:`sender_of`), so nobody can
make another's ``(source, seq)`` a duplicate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from jobsight.collector.jobs.allocations import Allocation, Registered
from jobsight.protocol.records import NODE_KINDS
from jobsight.protocol.wire import Batch


class AuthError(Exception):
    """A request without the right to do what it asks; ``status`` is 401 or 403. ``code`` names
    the rule a refused record broke, in a few fixed words (the metrics' label)."""

    def __init__(self, status: int, reason: str, code: str = "refused"):
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.code = code


@dataclass(frozen=True, slots=True)
class Refusal:
    """A record of a node token's batch that the token may not write: dropped, the rest stored."""

    index: int
    """Its place in the batch as sent."""
    kind: str
    code: str
    """The rule it broke: ``other_node``, ``not_allocated``, ``foreign_registration``."""
    reason: str

    def as_json(self) -> dict[str, Any]:
        return {"index": self.index, "reason": self.reason}


@dataclass(frozen=True)
class Principal:
    kind: Literal["admin", "job", "node"]
    job: str | None = None
    node: str | None = None
    cluster: str | None = None
    uid: int | None = None
    """A job token's uid, as the prolog minted it (``None``: minted without one)."""


def sender_of(principal: Principal) -> str:
    """Who sent a batch, as the ingest ledger keys it: a batch id ``(source, seq)`` is unique per
    sender, so one sender can never make another's batch a duplicate (docs/security.md)."""
    if principal.kind == "admin":
        return "admin"
    return f"{principal.kind}:{principal.cluster}/{principal.job if principal.kind == 'job' else principal.node}"


def authorize_batch(
    principal: Principal,
    batch: Batch,
    allocations: Mapping[str, Allocation] | None = None,
) -> list[Refusal]:
    """The records of a node token's batch that it may not write (the caller drops them and
    stores the rest); for a job or admin token, raise :class:`AuthError` (403, naming the
    record) unless it may write every record, and return ``[]``. A batch into another
    cluster is refused whole, whoever sends it.

    ``allocations`` maps each job id of the batch to its registration as the collector holds it
    (``None`` or absent: not registered by a prolog yet); see :func:`batch_jobs_to_check`.
    """
    if principal.kind == "admin":
        return []
    if batch.cluster != principal.cluster:
        raise AuthError(403, f"a {principal.kind} token of cluster {principal.cluster!r} "
                             f"cannot write into cluster {batch.cluster!r}")
    known = dict(allocations or {})
    if principal.kind == "job":
        registered = known.get(principal.job or "")
        check_job_owner(principal, registered)
        for index, record in enumerate(batch.records):
            _check_job_record(index, record, principal.job)
        return []
    refused: list[Refusal] = []
    for index, record in enumerate(batch.records):
        try:
            _check_node_record(index, record, principal.node, known)
        except AuthError as exc:
            refused.append(Refusal(index, record["kind"], exc.code, exc.reason))
    return refused


def _check_job_record(index: int, record: Mapping[str, Any], job: str | None) -> None:
    """A job token's record: of its own job, and nothing Slurm or the node has the say over."""
    if record["kind"] in NODE_KINDS:
        raise AuthError(403, f"record {index}: a job token cannot write {record['kind']} records "
                             "(the node daemon reports what runs on its GPUs)")
    if record["job"] != job:
        raise AuthError(403, f"record {index}: a job token of job {job} "
                             f"cannot write records of job {record['job']}")
    _check_job_token_lifecycle(index, record)


def _check_node_record(index: int, record: Mapping[str, Any], node: str | None, known: dict[str, Allocation]) -> None:
    """A node token's record, judged after the records before it in its batch (a ``job_started``
    of a job not known yet registers it in ``known``, as ingest will store it)."""
    if record.get("node") not in (None, node):
        raise AuthError(403, f"record {index}: the node token of {node} "
                             f"cannot write records of node {record.get('node')}", "other_node")
    if record["kind"] in NODE_KINDS:  # its own node's GPUs, no job
        return
    job = record["job"]
    registered = known.get(job)
    if registered is not None and registered.nodes:
        _check_allocated(index, record, node, registered.nodes)
    elif record["kind"] == "job_started":
        named = record.get("nodes") or [record.get("node") or node]
        if node not in named:
            raise AuthError(403, f"record {index}: the node token of {node} cannot register job {job} "
                                 f"on nodes {', '.join(named)} that do not include it", "foreign_registration")
        if record.get("user") is not None:
            known[job] = Registered(tuple(named), record.get("uid"))  # as ingest will store it


def _check_allocated(index: int, record: Mapping[str, Any], node: str | None, allocation: Sequence[str]) -> None:
    """A node token's record of a job whose allocation is known."""
    job = record["job"]
    if node not in allocation:
        what = "end" if record["kind"] == "job_ended" else "write records of"
        raise AuthError(403, f"record {index}: job {job} is not registered on node {node} "
                             f"(its allocation is {', '.join(allocation)}), so {node} cannot {what} it",
                        "not_allocated")
    if record["kind"] == "job_started":
        outside = sorted(set(record.get("nodes") or ()) - set(allocation))
        if outside:
            raise AuthError(403, f"record {index}: node {node} cannot add {', '.join(outside)} "
                                 f"to the allocation of job {job}", "not_allocated")


def batch_jobs_to_check(principal: Principal, batch: Batch) -> list[str]:
    """The job ids whose registrations :func:`authorize_batch` needs: every job of a
    node token's batch, a job token's own job."""
    if principal.kind == "node":
        return sorted({r["job"] for r in batch.records if r["kind"] not in NODE_KINDS})
    if principal.kind == "job" and principal.job is not None:
        return [principal.job]
    return []


def check_job_owner(principal: Principal, registered: Allocation) -> None:
    """Raise :class:`AuthError` (403) unless a job token was minted for the uid its job runs as.

    A job token names a job and a uid; once a prolog registered the job with its uid, a token of
    another uid (or of none) is not this job's, whatever job id it names: the token may have been
    minted for a job of the same id before it (an id Slurm reused) or by a fooled hook."""
    if principal.kind != "job" or registered is None or registered.uid is None:
        return
    if principal.uid != registered.uid:
        minted = "no uid" if principal.uid is None else f"uid {principal.uid}"
        raise AuthError(403, f"a job token minted for {minted} cannot act for job {principal.job}, "
                             f"which runs as uid {registered.uid}")


# What Slurm says about a job (who ran it, where, on what, for how long) comes from the
# prolog and epilog, which hold node tokens. A job token is in the user's hands, so it may
# add run metadata to its job but not rewrite the accounting that audits rely on. It may send a
# name and a demo flag: a run no prolog registered (outside Slurm, or before its prolog's record
# arrived) names itself, and once a prolog registered the job they are Slurm's and the ingest path
# keeps them (collector/ingest/write.py ``_job_started``: the first prolog's record replaces both, and
# a record without a user changes neither). Refusing them here would set aside the whole batch of a
# training process whose callback names its run, steps and logs with it.
_JOB_TOKEN_MAY_SET = frozenset({"kind", "job", "ts", "node", "name", "demo", "attrs"})


def _check_job_token_lifecycle(index: int, record: Mapping[str, object]) -> None:
    if record["kind"] == "job_ended":
        raise AuthError(403, f"record {index}: a job token cannot end its job (the epilog does)")
    if record["kind"] == "job_started":
        for field, value in record.items():
            if value is not None and field not in _JOB_TOKEN_MAY_SET:
                raise AuthError(403, f"record {index}: a job token cannot set the job's {field}")
