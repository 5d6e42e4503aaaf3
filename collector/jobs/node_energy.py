"""A job's share of its nodes' energy beside the GPUs, from its host samples.

The node daemon splits each node's power beside its GPUs across the node's jobs by CPU time and
sends each job's joules since its previous sample (``host_samples.energy_j``, with the source and
split named: ``agent/node/power/energy_split.py``). A job's node energy is their sum, over both tiers;
``samples`` and ``measured`` say how much of the job's host samples carried a figure, so a page can
say when a node had no source, or its BMC stopped answering for a while.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Final

from jobsight.collector.store.db import Connection
from jobsight.collector.tiers import host_tier

J_PER_KWH: Final = 3.6e6


def _sql(start: str | None) -> str:
    return f"""
SELECT count(*) AS samples, count(energy_j) AS measured, sum(energy_j) AS energy_j,
       array_remove(array_agg(DISTINCT power_source), NULL) AS sources,
       array_remove(array_agg(DISTINCT energy_split), NULL) AS splits
FROM {host_tier.samples(start=start)} h
"""


_ALL: Final = _sql(None)
_FROM: Final = _sql("%(start)s")


def node_energy(conn: Connection, cluster: str, job_id: str, since: dt.datetime | None = None) -> dict[str, Any]:
    """The job's node energy (from ``since`` on: a requeued job's latest run): ``energy_j`` and
    ``energy_kwh`` (``None`` when no sample carried one), ``sources`` and ``splits`` used, and how many
    host samples there were and carried a figure."""
    params = {"cluster": cluster, "job": job_id, "start": since}
    row = conn.execute(_ALL if since is None else _FROM, params).fetchone()
    energy_j = float(row["energy_j"]) if row is not None and row["energy_j"] is not None else None
    return {
        "energy_j": energy_j,
        "energy_kwh": energy_j / J_PER_KWH if energy_j is not None else None,
        "sources": sorted(row["sources"] or []) if row is not None else [],
        "splits": sorted(row["splits"] or []) if row is not None else [],
        "samples": int(row["samples"]) if row is not None else 0,
        "measured": int(row["measured"]) if row is not None else 0,
    }
