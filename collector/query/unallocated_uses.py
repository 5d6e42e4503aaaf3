"""GPUs used outside any job, for the admins: the ``gpu_unallocated_uses`` the node daemons reported.

Each row is one process the node daemon found on a GPU that no job on its node was given, and that
no job registered there holds (collector/ingest/unallocated_uses.py). The read is bounded: a window
of at most a year, newest first, at most ``limit`` rows, on the ``ts`` index.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Final

from jobsight.collector.store.db import Connection

MAX_ROWS: Final = 5000
"""The most rows one read returns."""

_USES: Final = """
SELECT cluster, node, ts, gpu_index, gpu_uuid, pid, uid, mem_used
FROM gpu_unallocated_uses
WHERE ts >= %(since)s AND ts <= %(until)s
  AND (%(cluster)s::text IS NULL OR cluster = %(cluster)s)
  AND (%(node)s::text IS NULL OR node = %(node)s)
ORDER BY ts DESC, node, gpu_index, pid
LIMIT %(limit)s
"""


@dataclass(frozen=True)
class UnallocatedUse:
    """One process seen on a GPU outside any job, at one report."""

    cluster: str
    node: str
    ts: dt.datetime
    gpu_index: int
    gpu_uuid: str
    pid: int
    uid: int | None
    """``None``: the daemon could not read it (the process had exited)."""
    mem_used: int | None
    """Bytes of GPU memory; ``None``: NVML did not say."""

    def as_json(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "node": self.node, "ts": self.ts.isoformat(), "gpu_index": self.gpu_index,
                "gpu_uuid": self.gpu_uuid, "pid": self.pid, "uid": self.uid, "mem_used": self.mem_used}


def unallocated_uses(conn: Connection, since: dt.datetime, until: dt.datetime, *, cluster: str | None = None,
                     node: str | None = None, limit: int = MAX_ROWS) -> list[UnallocatedUse]:
    """The uses reported in ``[since, until]``, newest first, at most ``limit`` (capped at
    :data:`MAX_ROWS`); ``cluster``/``node`` ``None``: every one."""
    params = {"since": since, "until": until, "cluster": cluster, "node": node, "limit": min(limit, MAX_ROWS)}
    return [UnallocatedUse(r["cluster"], r["node"], r["ts"], int(r["gpu_index"]), r["gpu_uuid"], int(r["pid"]),
                           r["uid"], r["mem_used"]) for r in conn.execute(_USES, params)]
