"""The running jobs' Prometheus exposition: ``GET /metrics/jobs``, for the site's Prometheus.

It carries every user's jobs (names, users, accounts), so it answers the admin token, or no token at
all where the site said its network keeps the port to its Prometheus (``exposition.allow_anonymous``);
a job's or node's token is refused (403) whatever the setting. What it shows and how it is bounded:
:mod:`jobsight.collector.api.job_exposition_text`; what it reads: :mod:`jobsight.collector.query.job_exposition`.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Annotated, Final

from fastapi import APIRouter, Header, Request, Response

from jobsight.collector.api.deps import Auth, ReadPool, Settings
from jobsight.collector.api.job_exposition_text import render
from jobsight.collector.config.settings import CollectorSettings
from jobsight.collector.ingest.write_rights import AuthError
from jobsight.collector.jobs.node_energy import J_PER_KWH
from jobsight.collector.query.job_energy import carbon_of, co2e_per_kwh
from jobsight.collector.query.job_exposition import JobEnergy, JobKey, read_energy, read_jobs_now
from jobsight.collector.store.db import Connection, unit_of_work

router = APIRouter(tags=["health"])

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
REFUSED: Final = ("the jobs' exposition holds every user's jobs: it is for the site's Prometheus (the admin "
                  "token), never a job's or node's token")


class ExpositionState:
    """What one collector process keeps between scrapes: the energy read (refreshed at most every
    ``energy_refresh_s``) and the count of series the cap left out."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.energy: dict[JobKey, JobEnergy] = {}
        self.energy_read_at: float | None = None
        self.left_out_total = 0

    def energy_of(self, conn: Connection, refresh_s: float) -> dict[JobKey, JobEnergy]:
        now = time.monotonic()
        with self.lock:
            if self.energy_read_at is not None and now - self.energy_read_at < refresh_s:
                return self.energy
        energy = read_energy(conn)
        with self.lock:
            self.energy, self.energy_read_at = energy, now
        return energy


_STATE_LOCK: Final = threading.Lock()


def _state(request: Request) -> ExpositionState:
    with _STATE_LOCK:
        state: ExpositionState | None = getattr(request.app.state, "job_exposition", None)
        if state is None:
            state = request.app.state.job_exposition = ExpositionState()
        return state


def _grams_per_joule(settings: CollectorSettings) -> float | None:
    kg_per_kwh = co2e_per_kwh(carbon_of(settings.carbon))
    return None if kg_per_kwh is None else kg_per_kwh * 1000.0 / J_PER_KWH


@router.get("/metrics/jobs", response_class=Response)
def job_metrics(
    request: Request, pool: ReadPool, settings: Settings, auth: Auth,
    authorization: Annotated[str | None, Header()] = None,
) -> Response:
    """Every running job's GPUs, ranks, open findings and energy so far, in Prometheus' text format
    (admin token; no token only where ``exposition.allow_anonymous``)."""
    wanted = settings.exposition
    if authorization is not None or not wanted.allow_anonymous:
        if auth.authenticate(authorization).kind != "admin":
            raise AuthError(403, REFUSED)
    state = _state(request)
    with unit_of_work(pool) as conn:
        now = read_jobs_now(conn, dt.datetime.now(dt.UTC), wanted.window_s)
        energy = state.energy_of(conn, wanted.energy_refresh_s)
    with state.lock:
        rendered = render(now, energy, _grams_per_joule(settings), wanted.max_series, state.left_out_total)
        state.left_out_total += rendered.series_left_out
    return Response(rendered.text, media_type=CONTENT_TYPE)
