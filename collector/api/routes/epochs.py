"""``GET /v1/jobs/{job_id}/epochs``: energy per epoch, from :mod:`jobsight.collector.query.epoch_energy`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from jobsight.collector.api.deps import Pool
from jobsight.collector.api.job_access import ReadableJob
from jobsight.collector.query import epoch_energy
from jobsight.collector.store.db import unit_of_work

router = APIRouter(prefix="/v1/jobs", tags=["read"])


@router.get("/{job_id}/epochs")
def get_epochs(job: ReadableJob, pool: Pool) -> dict[str, Any]:
    """Per training epoch: start, end, duration, steps, samples and samples/s, energy in J and
    kWh, J per sample, mean power, and how the energy was found (``method``: ``counter``, or
    ``power integral`` for GPUs without an energy counter, or both). The energy before the first
    epoch and after the last step is given too: with the epochs it adds up to the job's energy
    (``energy_j``). For a running job that is its energy so far, and the last epoch's figures,
    the time after it and the total are still growing (``growing``)."""
    with unit_of_work(pool) as conn:
        return epoch_energy.job_epochs(conn, job.cluster, job.job_id, running=job.row["state"] == "running")
