"""The emissions pass: each ended job's kg CO2e, computed once and kept in its summary.

A job's summary is (re)computed in the ingest transaction when it ends, and again when late samples
come; its emissions need the carbon intensity of the hours it ran, which may mean an HTTP request
to the site's intensity provider, so they are not computed there. This pass, every
:data:`INTERVAL_S` in every collector process, takes the summaries that have none yet (their
``co2e_kg`` is NULL and their ``summary`` has no ``emissions``), computes them as the job page does
(:func:`jobsight.collector.query.job_energy.emissions`) and stores both. Rows are claimed with
``SKIP LOCKED``: two processes never compute one job's twice at once.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from typing import Final

from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from jobsight.collector.query.carbon_intensity import CarbonIntensity
from jobsight.collector.query.job_energy import emissions, hourly_kwh
from jobsight.collector.store.db import Connection, autocommit_connection

log = logging.getLogger("jobsight.collector.emissions")

INTERVAL_S: Final = 60.0
BATCH: Final = 200

_PENDING: Final = """
SELECT cluster, job_id, energy_kwh, summary FROM job_summaries
WHERE co2e_kg IS NULL AND NOT summary ? 'emissions'
ORDER BY computed_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
"""


def fill_emissions(conn: Connection, carbon: CarbonIntensity, limit: int = BATCH) -> int:
    """Compute and store the emissions of up to ``limit`` ended jobs that have none; returns how many.
    A job with no energy figure at all keeps ``co2e_kg`` NULL and says why in its summary."""
    if not carbon.configured():
        return 0
    done = 0
    with conn.transaction():
        for row in conn.execute(_PENDING, {"limit": limit}).fetchall():
            summary = row["summary"]
            start = summary.get("start") if summary.get("run") else None  # a requeued job: its latest run
            since = dt.datetime.fromisoformat(start) if isinstance(start, str) else None
            figure = emissions(carbon, hourly_kwh(conn, row["cluster"], row["job_id"], row["energy_kwh"], since))
            summary["emissions"] = figure or {"co2e_kg": None, "reason": "the job has no energy figure"}
            conn.execute("UPDATE job_summaries SET co2e_kg = %s, summary = %s WHERE cluster = %s AND job_id = %s",
                         (figure["co2e_kg"] if figure else None, Jsonb(summary), row["cluster"], row["job_id"]))
            done += 1
    return done


def run(pool: ConnectionPool[Connection], carbon: CarbonIntensity, stop: threading.Event) -> None:
    """:func:`fill_emissions` every :data:`INTERVAL_S` until ``stop`` is set."""
    while not stop.wait(INTERVAL_S):
        try:
            with autocommit_connection(pool) as conn:
                while fill_emissions(conn, carbon) == BATCH:
                    pass
        except Exception:  # boundary: a failed pass must not kill the collector; the next one retries
            log.exception("emissions pass failed")
