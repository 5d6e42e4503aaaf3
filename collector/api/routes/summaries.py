"""``GET /v1/jobs/{job_id}/summary``: the job summary of :mod:`jobsight.collector.jobs.summaries`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from jobsight.collector.api.deps import ReadPool, Settings
from jobsight.collector.api.job_access import AuthorizedJob, job_not_found
from jobsight.collector.jobs import summaries
from jobsight.collector.query.job_energy import carbon_of, job_energy
from jobsight.collector.store.db import unit_of_work
from jobsight.rules import links

router = APIRouter(prefix="/v1/jobs", tags=["read"])


@router.get("/{job_id}/summary")
def get_summary(job: AuthorizedJob, pool: ReadPool, settings: Settings) -> dict[str, Any]:
    """The stored summary of an ended job (``final: true``), or one computed now from the
    rows so far for a job still running (``final: false``, not stored), with the link to
    the job's dashboard page (``dashboard_url``) and the dashboard's public URL
    (``dashboard_base_url``), under which ``jobsight report`` builds its other links; ``energy``: the
    whole job's energy and emissions (as ``GET /v1/jobs/{job_id}/energy``)."""
    # Not ReadableJob: a stored summary answers on its own, whatever the jobs table holds;
    # only a job with neither a stored nor a live summary is unknown (404).
    link = links.job_link(job.cluster, job.job_id, base=settings.dashboard_url)
    with unit_of_work(pool) as conn:
        stored = summaries.get_summary(conn, job.cluster, job.job_id)
        live = summaries.compute_summary(conn, job.cluster, job.job_id) if stored is None else None
        if stored is None and live is None:
            raise job_not_found(job)
        energy = job_energy(conn, job.cluster, job.job_id, carbon_of(settings.carbon), stored)
    return {
        "cluster": job.cluster,
        "job_id": job.job_id,
        "final": stored is not None,
        "computed_at": stored["computed_at"] if stored is not None else None,
        "summary": stored["summary"] if stored is not None else live,
        "dashboard_url": link,
        "dashboard_base_url": settings.dashboard_url,
        "energy": energy,
    }
