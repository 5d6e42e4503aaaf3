"""``GET /v1/jobs/{job_id}/epochs``: energy per epoch (:mod:`jobsight.collector.query.epoch_energy`);
``GET /v1/jobs/{job_id}/energy``: the whole job's energy and emissions (:mod:`jobsight.collector.query.job_energy`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from jobsight.collector.api.deps import HeavyReadTurn, ReadPool, Settings
from jobsight.collector.api.job_access import ReadableJob
from jobsight.collector.jobs import summaries
from jobsight.collector.query.job_energy import carbon_of, job_energy
from jobsight.collector.store.db import unit_of_work

router = APIRouter(prefix="/v1/jobs", tags=["read"])


@router.get("/{job_id}/epochs", response_class=Response)
def get_epochs(job: ReadableJob, settings: Settings, workers: HeavyReadTurn) -> Response:
    """Per training epoch: start, end, duration, steps, samples and samples/s, energy in J and
    kWh, J per sample, mean power, and how the energy was found (``method``: ``counter``, or
    ``power integral`` for GPUs without an energy counter, or both). The energy before the first
    epoch and after the last step is given too: with the epochs it adds up to the job's energy
    (``energy_j``). For a running job that is its energy so far, and the last epoch's figures,
    the time after it and the total are still growing (``growing``). At most ``max_epochs_per_read``
    epochs are listed, the latest: ``epochs_left_out`` is the earlier ones as one span, with how many
    (``None``: none left out), and ``epoch_count`` all of them."""
    # Read in a worker process (query/read_workers.py): its CPU is not the ingest process's.
    answer = workers.epochs_json(job.cluster, job.job_id, running=job.row["state"] == "running",
                                 max_epochs=settings.max_epochs_per_read)
    return Response(answer, media_type="application/json")


@router.get("/{job_id}/energy")
def get_energy(job: ReadableJob, pool: ReadPool, settings: Settings) -> dict[str, Any]:
    """The job's energy in kWh: its GPUs' (``gpu_kwh``, as in its summary), its share of its nodes'
    power beside the GPUs (``node_kwh``, with ``node``: the sources, the split and how many of its
    host samples carried a figure) and both (``total_kwh``); ``emissions``: kg CO2e with the PUE, the
    energy-weighted carbon intensity and its sources (``None`` where the site set no intensity);
    ``final``: the job ended and these are its summary's figures, else they are so far."""
    with unit_of_work(pool) as conn:
        stored = summaries.get_summary(conn, job.cluster, job.job_id)
        return {"cluster": job.cluster, "job_id": job.job_id,
                **job_energy(conn, job.cluster, job.job_id, carbon_of(settings.carbon), stored)}
