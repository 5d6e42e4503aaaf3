"""What each GPU of an ended job counted in errors while it ran: the rise of its NVLink, PCIe and
ECC counters from its first readings to its last, and the memory flags its last reading held.

The counters count since the driver loaded, so a job's share is last minus first. Only the
readings near the job's first and last samples are read (:data:`EDGE`), from both tiers, so a
nine-day job costs what a minute of it does. Kept in the job's summary (``gpus[].faults``), which
the suspect-GPU list (``collector/query/suspects.py``) reads across jobs.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, Final

from jobsight.collector.store.db import Connection
from jobsight.collector.tiers import reads as tiers

EDGE: Final = dt.timedelta(minutes=2)
"""How far from the job's first and last samples a GPU's first and last readings are looked for."""
COUNTERS: Final = ("nvlink_crc_errors", "nvlink_replay_errors", "nvlink_recovery_errors", "pcie_replays",
                   "ecc_errors")
FLAGS: Final = ("remapped_rows_pending", "remap_failure", "retired_pages_pending", "lost")


def _edge_sql(first: bool) -> str:
    samples = tiers.samples((*COUNTERS, *FLAGS), start="%(start)s", end="%(end)s")
    return f"""
SELECT DISTINCT ON (node, gpu_index) node, gpu_index, {", ".join((*COUNTERS, *FLAGS))}
FROM {samples} s WHERE coalesce(mig_uuid, '') = ''
ORDER BY node, gpu_index, ts {"ASC" if first else "DESC"}
"""


_FIRST: Final = _edge_sql(first=True)
_LAST: Final = _edge_sql(first=False)

Key = tuple[str | None, int]


def _rows(conn: Connection, sql: str, params: Mapping[str, Any]) -> dict[Key, dict[str, Any]]:
    return {(r["node"], r["gpu_index"]): r for r in conn.execute(sql, params)}


def gpu_faults(conn: Connection, cluster: str, job: str, first: dt.datetime,
               last: dt.datetime) -> dict[Key, dict[str, Any]]:
    """Per physical GPU (node, index) with anything to say: each counter's rise (only those that
    rose) and each flag its last reading held (only those set)."""
    base = {"cluster": cluster, "job": job}
    heads = _rows(conn, _FIRST, {**base, "start": first, "end": first + EDGE})
    tails = _rows(conn, _LAST, {**base, "start": last - EDGE, "end": last})
    out: dict[Key, dict[str, Any]] = {}
    for key, tail in tails.items():
        head = heads.get(key, tail)
        faults: dict[str, Any] = {}
        for counter in COUNTERS:
            if tail[counter] is not None and head[counter] is not None and tail[counter] > head[counter]:
                faults[counter] = int(tail[counter] - head[counter])
        faults.update({flag: True for flag in FLAGS if tail[flag]})
        if faults:
            out[key] = faults
    return out
