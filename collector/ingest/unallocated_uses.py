"""Storing ``gpu_unallocated_use`` records: processes on GPUs that no job was given.

A node daemon reports each process it finds on a GPU that no registration on its node names and
that no registered job's cgroup holds (``agent/node/attribution.py``). Such a use belongs to no
job, so it goes to a table of its own, ``gpu_unallocated_uses``, which only admins read
(``GET /v1/unallocated-gpu-uses``), written in the batch's transaction like its other rows.
A row is keyed by cluster, node, GPU, time and pid: a record sent again under another batch id
is stored once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from jobsight.collector.store.db import Connection

_INSERT: Final = """
INSERT INTO gpu_unallocated_uses (cluster, node, ts, gpu_index, gpu_uuid, pid, uid, mem_used)
SELECT %(cluster)s, u.* FROM unnest(%(node)s::text[], %(ts)s::timestamptz[], %(gpu_index)s::int2[],
                                    %(gpu_uuid)s::text[], %(pid)s::int4[], %(uid)s::int4[], %(mem_used)s::int8[]) u
ON CONFLICT DO NOTHING"""
_COLUMNS: Final = ("node", "ts", "gpu_index", "gpu_uuid", "pid", "uid", "mem_used")


def insert(conn: Connection, cluster: str, records: Sequence[dict[str, Any]]) -> None:
    """Store the prepared records (``ts`` a datetime) of one batch of ``cluster``; nothing when none."""
    if not records:
        return
    params: dict[str, Any] = {name: [r.get(name) for r in records] for name in _COLUMNS}
    params["cluster"] = cluster
    conn.execute(_INSERT, params)
