"""Every read the dashboard makes: cached wrappers (explicit TTL) around the collector's
query layer (CONTRIBUTING rule 12). Pages never write SQL and never open connections.

Access control lives here too, so a page cannot forget it: job lists are limited to the
viewer's own jobs unless they are an admin, and per-job reads take a :class:`JobRef`,
which only :func:`open_job` hands out after checking the viewer may see that job.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pandas as pd
import streamlit as st
from psycopg_pool import ConnectionPool

from jobsight.collector.config.carbon import load_carbon_settings
from jobsight.collector.config.health import load_health_settings
from jobsight.collector.query import actions as action_queries
from jobsight.collector.query import audit as audit_queries
from jobsight.collector.query import epoch_energy, rank_outliers
from jobsight.collector.query import findings as finding_queries
from jobsight.collector.query import gpu_events as gpu_event_queries
from jobsight.collector.query import job_energy as energy_queries
from jobsight.collector.query import logs as log_queries
from jobsight.collector.query import profiles as profile_queries
from jobsight.collector.query import series as queries
from jobsight.collector.query.carbon_intensity import CarbonIntensity
from jobsight.collector.query.grids import read_gpu_grid_by_gpu, read_metric_grid, read_step_grid
from jobsight.collector.query.jobs import get_job, list_jobs
from jobsight.collector.query.series import GPU_MEASURES, GpuMeasures
from jobsight.collector.query.suspects import suspect_gpus
from jobsight.collector.store.db import (
    READ_POOL,
    Connection,
    DatabaseUnavailable,
    ReadTooLong,
    open_pool,
    unit_of_work,
)
from jobsight.dashboard import gpu_columns, read_outage
from jobsight.dashboard.identity import Viewer
from jobsight.dashboard.settings import dashboard_settings
from jobsight.rules.hardware_cause import xid_text

T = TypeVar("T")

TTL = dt.timedelta(seconds=dashboard_settings().cache_ttl_s)


READ_STATEMENT_TIMEOUT_S = 30.0
"""A page's query is cancelled past this (PostgreSQL's ``statement_timeout``), as the collector's reads are."""
READ_CONNECTIONS = 4
"""Connections of this dashboard process's pool: pages of one job share its cached reads, so sessions
add little (``bench/live_pages.py``)."""
BUSY_WAIT_S = 30.0
"""How long a read waits for a connection while the server is there but every connection is busy
(the pool's own wait, 5 s, comes round again until then) before the page says so."""


@st.cache_resource(show_spinner=False)
def _pool(database_url: str) -> ConnectionPool[Connection]:
    return open_pool(database_url, size=READ_CONNECTIONS, statement_timeout_s=READ_STATEMENT_TIMEOUT_S,
                     name=READ_POOL)


def _read(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(conn, *args, **kwargs)`` in one transaction. When the database cannot be read, the page says
    why in words where it has got to and stops (:func:`jobsight.dashboard.read_outage.stop_page`)."""
    retry_s = dashboard_settings().refresh_s
    url = os.environ.get("JOBSIGHT_DATABASE_URL")
    if not url:
        read_outage.stop_page(read_outage.Unreadable("unconfigured"), retry_s)
    outage = read_outage.outage_of(url)
    try:
        result = _read_from(url, outage, fn, *args, **kwargs)
    except read_outage.Unreadable as problem:
        read_outage.stop_page(outage.met(problem, retry_s), retry_s)
    outage.passed()
    return result


def _read_from(url: str, outage: read_outage.ReadOutage, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    if outage.ongoing and (problem := read_outage.connection_cause(url)) is not None:
        raise problem  # at once, not after the pool's wait: one new connection says whether it is over
    deadline = time.monotonic() + BUSY_WAIT_S
    while True:
        try:
            with unit_of_work(_pool(url)) as conn:
                return fn(conn, *args, **kwargs)
        except ReadTooLong as exc:
            raise read_outage.Unreadable("slow", str(exc)) from exc
        except DatabaseUnavailable as exc:
            # The pool's wait ended with no connection, or one broke: whether the server is there
            # decides between an outage (the cause a new connection meets) and a busy pool (wait again).
            if (problem := read_outage.connection_cause(url)) is not None:
                raise problem from exc
            if time.monotonic() >= deadline:
                raise read_outage.Unreadable("busy", str(exc)) from exc


def _frame(rows: Sequence[dict[str, Any]], columns: Sequence[str] = ()) -> pd.DataFrame:
    return pd.DataFrame(list(rows)) if rows else pd.DataFrame(columns=list(columns))


@dataclass(frozen=True)
class JobRef:
    """A job the viewer was allowed to open (only :func:`open_job` makes one)."""

    cluster: str
    job_id: str


@dataclass(frozen=True)
class JobAccess:
    """What :func:`open_job` found: ``ref`` and ``job`` are ``None`` when the job does not exist
    or is not the viewer's; ``reason`` then says which, without telling another user's data."""

    ref: JobRef | None
    job: dict[str, Any] | None
    reason: str | None = None


# ---- job list and job header ------------------------------------------------------------

@st.cache_data(ttl=TTL, show_spinner=False)
def _jobs(filters: tuple[tuple[str, Any], ...], limit: int) -> tuple[pd.DataFrame, int]:
    rows, total = _read(list_jobs, limit=limit, **dict(filters))
    return _frame(rows), total


def jobs(
    viewer: Viewer,
    *,
    cluster: str | None = None,
    user: str | None = None,
    state: str | None = None,
    partition: str | None = None,
    since: dt.datetime | None = None,
    max_mean_util: float | None = None,
    limit: int = 200,
) -> tuple[pd.DataFrame, int]:
    """Jobs the viewer may see, running first. ``user`` is honoured for admins only."""
    owner = user if viewer.is_admin else viewer.name
    filters = (("cluster", cluster), ("user", owner), ("state", state), ("partition", partition),
               ("since", since), ("max_mean_util", max_mean_util))
    return _jobs(filters, limit)


@st.cache_data(ttl=TTL, show_spinner=False)
def _job(cluster: str, job_id: str) -> dict[str, Any] | None:
    return _read(get_job, cluster, job_id)


def open_job(viewer: Viewer, cluster: str, job_id: str) -> JobAccess:
    job = _job(cluster, job_id)
    if job is None:
        return JobAccess(None, None, f"No job {job_id} on cluster {cluster}.")
    if not viewer.may_see(job):
        # Same wording whatever the owner, so the page reveals nothing about them.
        return JobAccess(None, None, f"Job {job_id} is not your job: only its owner and admins can open it.")
    return JobAccess(JobRef(cluster, job_id), job)


# ---- per-job series (take a JobRef) ------------------------------------------------------

@st.cache_data(ttl=TTL, show_spinner=False)
def _gpu(cluster: str, job_id: str, cells: int, most: int, span: dt.timedelta | None,
         measures: GpuMeasures) -> pd.DataFrame:
    return gpu_columns.frame(_read(read_gpu_grid_by_gpu, cluster, job_id, cells, most, span=span, measures=measures),
                             measures)


def gpu_series(ref: JobRef, cells: int, most: int, span: dt.timedelta | None = None, *,
               measures: GpuMeasures = GPU_MEASURES) -> pd.DataFrame:
    """Per GPU and bucket over the run's last ``span`` (``None``: all of it), with GPUs × buckets within
    ``cells`` and at most ``most`` buckets a GPU, or a bucket a sample when the window's samples are few
    (:func:`jobsight.collector.query.grids.read_gpu_grid`); each row with its bucket's width (``bucket_s``,
    never under the sampling interval) and the interval (``interval_s``), and ``measures`` (all by
    default; the heatmap reads :data:`jobsight.collector.query.series.UTILISATION` alone)."""
    return _gpu(ref.cluster, ref.job_id, cells, most, span, measures)


@st.cache_data(ttl=TTL, show_spinner=False)
def _steps(cluster: str, job_id: str, cells: int, most: int, span: dt.timedelta | None) -> pd.DataFrame:
    return _frame(_read(read_step_grid, cluster, job_id, cells, most, span=span),
                  ("rank", "bucket", "duration_s", "steps", "samples", "last_step", "own_s"))


def step_series(ref: JobRef, cells: int, most: int, span: dt.timedelta | None = None) -> pd.DataFrame:
    """Per rank and bucket over the run's last ``span`` (``None``: all of it), with ranks × buckets within
    ``cells`` and at most ``most`` buckets a rank; ``own_s`` is the rank's own work per step (data wait +
    forward), ``None`` where a step did not measure it."""
    return _steps(ref.cluster, ref.job_id, cells, most, span)


def step_view(steps: pd.DataFrame, budget: int) -> rank_outliers.StepView:
    """What the step chart draws of ``steps`` (:func:`step_series`, or :func:`moment`'s) within ``budget``
    points: the stragglers by the one rule, the band across many ranks and the ranks drawn alone, and,
    where the steps measured it, the same of each rank's own work per step (``own_band``, ``own_s`` of the
    ``lines``): :func:`jobsight.collector.query.rank_outliers.step_view`."""
    return rank_outliers.step_view(steps, rank_outliers.find_stragglers(steps), budget)


@st.cache_data(ttl=TTL, show_spinner=False)
def _metrics(cluster: str, job_id: str, points: int, most: int, span: dt.timedelta | None) -> pd.DataFrame:
    return _frame(_read(read_metric_grid, cluster, job_id, points, most, span=span),
                  ("name", "rank", "bucket", "value", "step"))


def metric_series(ref: JobRef, points: int, most: int, span: dt.timedelta | None = None) -> pd.DataFrame:
    """Per metric, rank and bucket over the run's last ``span`` (``None``: all of it), with each metric's
    ranks × buckets within ``points`` and at most ``most`` buckets a rank."""
    return _metrics(ref.cluster, ref.job_id, points, most, span)


@st.cache_data(ttl=TTL, show_spinner=False)
def _markers(cluster: str, job_id: str) -> pd.DataFrame:
    """Timeline markers: warnings and errors from the log, epoch starts, profiling windows, and the
    Xid errors its GPUs reported ("Xid 79 (GPU fell off the bus) on n1/3")."""
    def read_all(conn: Connection) -> tuple[list[dict[str, Any]], ...]:  # one transaction, not four
        return (log_queries.log_events(conn, cluster, job_id, level="WARNING", limit=200),
                queries.epoch_starts(conn, cluster, job_id), profile_queries.profile_windows(conn, cluster, job_id),
                gpu_event_queries.job_xids(conn, cluster, job_id))

    logs, epochs, windows, xids = _read(read_all)
    rows = [{"kind": f"log {r['level'].lower()}", "start": r["ts"], "end": r["ts"], "label": r["message"][:120]}
            for r in logs]
    rows += [{"kind": "epoch", "start": r["ts"], "end": r["ts"], "label": f"epoch {r['epoch']}"} for r in epochs]
    rows += [{"kind": "profile", "start": r["start"], "end": r["end"],
              "label": f"profile {r['profile_id']} steps {r['step_start']}-{r['step_end']}"} for r in windows]
    rows += [{"kind": "xid", "start": r["ts"], "end": r["ts"],
              "label": f"{xid_text(int(r['code']))} on {r['node'] or '?'}/{r['gpu_index']}"} for r in xids]
    return _frame(rows, ("kind", "start", "end", "label"))


def markers(ref: JobRef) -> pd.DataFrame:
    return _markers(ref.cluster, ref.job_id)


@st.cache_data(ttl=TTL, show_spinner=False)
def _logs(cluster: str, job_id: str, filters: tuple[tuple[str, Any], ...], limit: int) -> pd.DataFrame:
    return _frame(_read(log_queries.log_events, cluster, job_id, limit=limit, **dict(filters)),
                  ("ts", "node", "rank", "rank_from_pid", "pid", "tid", "thread", "level", "logger", "message",
                   "exception"))


def logs(ref: JobRef, *, rank: int | None = None, pid: int | None = None, tid: int | None = None,
         level: str | None = None, text: str | None = None, limit: int = 500) -> pd.DataFrame:
    filters = (("rank", rank), ("pid", pid), ("tid", tid), ("level", level), ("text", text or None))
    return _logs(ref.cluster, ref.job_id, filters, limit)


@st.cache_data(ttl=TTL, show_spinner=False)
def _profiles(cluster: str, job_id: str) -> list[dict[str, Any]]:
    return _read(profile_queries.list_profiles, cluster, job_id)


def profiles(ref: JobRef) -> list[dict[str, Any]]:
    return _profiles(ref.cluster, ref.job_id)


@st.cache_data(ttl=dt.timedelta(minutes=5), show_spinner=False, max_entries=8)
def _trace(cluster: str, job_id: str, row_id: int) -> bytes | None:
    return _read(profile_queries.profile_trace, cluster, job_id, row_id)


def profile_trace(ref: JobRef, row_id: int) -> bytes | None:
    return _trace(ref.cluster, ref.job_id, row_id)


@st.cache_data(ttl=TTL, show_spinner=False)
def _requests(cluster: str, job_id: str) -> pd.DataFrame:
    return _frame(_read(profile_queries.profile_requests, cluster, job_id),
                  ("id", "created_at", "requested_by", "steps", "ranks", "state", "reason"))


def profile_requests(ref: JobRef) -> pd.DataFrame:
    return _requests(ref.cluster, ref.job_id)


def request_profile(viewer: Viewer, ref: JobRef, steps: int, ranks: Sequence[int] | None) -> int:
    """The dashboard's one write: ask the job for a profile of its next ``steps`` steps."""
    request_id = _read(profile_queries.request_profile, ref.cluster, ref.job_id, steps, ranks, viewer.name)
    _requests.clear()
    return request_id


# ---- audit (admins) ------------------------------------------------------------------------

def _admin_only(viewer: Viewer) -> None:
    if not viewer.is_admin:
        raise PermissionError("the audit is for admins")


@st.cache_data(ttl=TTL, show_spinner=False)
def _audit(start: dt.datetime, end: dt.datetime, cluster: str | None, low: float, idle: float,
           factors: str) -> dict[str, Any]:
    del factors  # the cache's key, as for _energy
    factor = energy_queries.co2e_per_kwh(carbon())

    def read_all(conn: Connection) -> dict[str, Any]:
        return {
            "totals": audit_queries.audit_totals(conn, start, end, cluster=cluster, co2e_per_kwh=factor),
            **{group: _frame(audit_queries.gpu_hours_by(conn, group, start, end, cluster=cluster,
                                                        co2e_per_kwh=factor),
                             ("name", "jobs", "gpu_hours", "mean_util", "energy_kwh", "energy_share",
                              "node_energy_kwh", "total_energy_kwh", "co2e_kg"))
               for group in ("user_name", "account", "partition")},
            "idle": _frame(audit_queries.underused_allocations(conn, start, end, below_percent=idle, cluster=cluster)),
            "low": _frame(audit_queries.underused_allocations(conn, start, end, below_percent=low, cluster=cluster)),
            "trend": _frame(audit_queries.daily_trend(conn, start, end, low_util_percent=low, cluster=cluster),
                            ("day", "gpu_hours", "low_util_gpu_hours", "energy_kwh")),
        }

    return _read(read_all)


def audit(viewer: Viewer, start: dt.datetime, end: dt.datetime, *, cluster: str | None,
          low_util_percent: float, idle_util_percent: float) -> dict[str, Any]:
    """Totals, GPU-hours by user/account/partition, idle and low-use jobs, daily trend."""
    _admin_only(viewer)
    return _audit(start, end, cluster, low_util_percent, idle_util_percent, carbon().settings.model_dump_json())


# ---- waste policies' steps ----------------------------------------------------------------------

@st.cache_data(ttl=TTL, show_spinner=False)
def _job_actions(cluster: str, job_id: str) -> list[dict[str, Any]]:
    return _read(action_queries.job_actions, cluster, job_id)


def job_actions(ref: JobRef) -> list[dict[str, Any]]:
    """The steps waste policies took for the job, oldest first (its owner sees them: they are about
    their job, and warned them)."""
    return _job_actions(ref.cluster, ref.job_id)


ACTIONS_LIMIT = 1000
"""Steps the Actions page lists at most, the newest first."""
ACTION_COLUMNS = ("id", "cluster", "job_id", "finding_id", "policy", "rule", "step", "at", "dry_run", "outcome",
                  "detail", "evidence", "user_name", "account", "partition", "job_name")
COUNT_COLUMNS = ("name", "jobs", "warnings", "cancelled", "requeued", "dry_run", "notify_only", "held_back", "failed",
                 "exempt")


def _admin_actions(viewer: Viewer) -> None:
    if not viewer.is_admin:
        raise PermissionError("the actions across jobs are for admins")


@st.cache_data(ttl=TTL, show_spinner=False)
def _actions(filters: tuple[tuple[str, Any], ...], limit: int) -> tuple[pd.DataFrame, int]:
    rows, total = _read(action_queries.list_actions, limit=limit, **dict(filters))
    return _frame(rows, ACTION_COLUMNS), total


def actions(viewer: Viewer, *, cluster: str | None, user: str | None = None, account: str | None = None,
            step: str | None = None, outcome: str | None = None, since: dt.datetime | None = None,
            limit: int = ACTIONS_LIMIT) -> tuple[pd.DataFrame, int]:
    """Every job's steps matching the filters, newest first, with the job's user, account, partition
    and name; and how many match in all."""
    _admin_actions(viewer)
    filters = (("cluster", cluster), ("user", user), ("account", account), ("step", step), ("outcome", outcome),
               ("since", since))
    return _actions(filters, limit)


@st.cache_data(ttl=TTL, show_spinner=False)
def _action_counts(group: str, filters: tuple[tuple[str, Any], ...]) -> pd.DataFrame:
    return _frame(_read(action_queries.action_counts, group, **dict(filters)), COUNT_COLUMNS)


def action_counts(viewer: Viewer, group: str, *, cluster: str | None, user: str | None = None,
                  account: str | None = None, since: dt.datetime | None = None) -> pd.DataFrame:
    """Per user (``group="user_name"``) or account, the jobs with steps and each kind of step's count
    (:func:`jobsight.collector.query.actions.action_counts`)."""
    _admin_actions(viewer)
    return _action_counts(group, (("cluster", cluster), ("user", user), ("account", account), ("since", since)))


# ---- suspect GPUs (admins) ---------------------------------------------------------------------

@st.cache_data(ttl=TTL, show_spinner=False)
def _suspects(since: dt.datetime, until: dt.datetime, cluster: str | None, min_jobs: int) -> list[dict[str, Any]]:
    return [gpu.as_json(min_jobs) for gpu in _read(suspect_gpus, since, until, cluster)]


def suspects(viewer: Viewer, since: dt.datetime, until: dt.datetime, *, cluster: str | None) -> list[dict[str, Any]]:
    """The GPUs that hurt jobs in ``[since, until]``, most jobs first, each as
    :meth:`jobsight.collector.query.suspects.SuspectGpu.as_json` has it, its drain line included
    (admins only: it names every user's jobs). A drain line only at the collector's
    ``suspect_alert_jobs`` jobs (``JOBSIGHT_HEALTH_*``, ``[health]``): under it, ``worth_watching``."""
    if not viewer.is_admin:
        raise PermissionError("the suspect GPUs are for admins")
    return _suspects(since, until, cluster, load_health_settings().suspect_alert_jobs)


# ---- energy per epoch (takes a JobRef) -------------------------------------------------------

@st.cache_data(ttl=TTL, show_spinner=False)
def _epochs(cluster: str, job_id: str, running: bool) -> dict[str, Any]:
    return _read(epoch_energy.job_epochs, cluster, job_id, running=running)


def carbon() -> CarbonIntensity:
    """The site's carbon intensity (``[carbon]``, ``JOBSIGHT_CARBON_*``), as the collector reads it."""
    return energy_queries.carbon_of(load_carbon_settings())


@st.cache_data(ttl=TTL, show_spinner=False)
def _energy(cluster: str, job_id: str, factors: str) -> dict[str, Any]:
    del factors  # the cache's key: figures of other carbon settings are not these
    return _read(energy_queries.read_job_energy, cluster, job_id, carbon())


def energy(ref: JobRef) -> dict[str, Any]:
    """The whole job's energy and emissions: :func:`jobsight.collector.query.job_energy.job_energy`."""
    return _energy(ref.cluster, ref.job_id, carbon().settings.model_dump_json())


def epochs(ref: JobRef, running: bool) -> dict[str, Any]:
    """Energy per epoch, before the first and after the last, and the job's energy (so far, when
    ``running``): :func:`jobsight.collector.query.epoch_energy.job_epochs`."""
    return _epochs(ref.cluster, ref.job_id, running)


# ---- health findings -------------------------------------------------------------------------

@st.cache_data(ttl=TTL, show_spinner=False)
def _findings(cluster: str, job_id: str) -> list[dict[str, Any]]:
    return _read(finding_queries.job_findings, cluster, job_id)


def findings(ref: JobRef) -> list[dict[str, Any]]:
    """The job's findings, open first (most severe first), then resolved, newest first."""
    return _findings(ref.cluster, ref.job_id)


@st.cache_data(ttl=TTL, show_spinner=False)
def _open_by_job(keys: tuple[tuple[str, str], ...]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    return _read(finding_queries.open_by_job, keys)


def open_findings_by_job(viewer: Viewer, jobs: pd.DataFrame) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The open findings of each row of ``jobs`` (a frame from :func:`jobs`) that the viewer may see,
    by (cluster, job_id), most severe first: one query for the whole page."""
    if jobs.empty:
        return {}
    keys = tuple((c, j) for c, j, u in zip(jobs["cluster"], jobs["job_id"], jobs["user_name"], strict=True)
                 if viewer.may_see({"user_name": u}))
    return _open_by_job(keys)


ATTENTION_LIMIT = 1000
"""Open findings the Attention view reads at most, the most severe first."""


@st.cache_data(ttl=TTL, show_spinner=False)
def _attention(cluster: str | None, rule: str | None, limit: int) -> tuple[pd.DataFrame, int]:
    rows, total = _read(finding_queries.list_findings, state="open", cluster=cluster, rule=rule, limit=limit)
    return _frame(rows, ("id", "cluster", "job_id", "rule", "subject", "rank", "node", "gpu", "severity", "state",
                         "opened_at", "updated_at", "resolved_at", "at_ts", "title", "message", "evidence",
                         "user_name", "account", "partition", "job_name", "demo", "attrs")), total


def attention(viewer: Viewer, *, cluster: str | None, rule: str | None = None,
              limit: int = ATTENTION_LIMIT) -> tuple[pd.DataFrame, int]:
    """The open findings across the cluster (all clusters: ``None``), most severe first, with their
    job's user, account and partition; and how many are open in all."""
    if not viewer.is_admin:
        raise PermissionError("the Attention view is for admins")
    return _attention(cluster, rule, limit)


@st.cache_data(ttl=TTL, show_spinner=False)
def _moment(cluster: str, job_id: str, start: dt.datetime, end: dt.datetime,
            points: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    def read_both(conn: Connection) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return (queries.gpu_series(conn, cluster, job_id, start=start, end=end, points=points),
                queries.step_series(conn, cluster, job_id, start=start, end=end, points=points))

    gpus, steps = _read(read_both)
    return (_frame(gpus, ("node", "gpu_index", "bucket", "bucket_s", "interval_s", "util_gpu", "mem_used", "power_w",
                          "temp_c")),
            _frame(steps, ("rank", "bucket", "duration_s", "steps", "samples", "last_step")))


def moment(ref: JobRef, start: dt.datetime, end: dt.datetime, points: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every GPU's and every rank's series from ``start`` to ``end``, ``points`` buckets each: the
    window around a finding's moment."""
    return _moment(ref.cluster, ref.job_id, start, end, points)
