"""Reading a job's GPU events (``gpu_events``: the critical Xid errors NVML reported on its GPUs),
for the marks on its page's timeline. The suspects across jobs are read in :mod:`.suspects`."""

from __future__ import annotations

from typing import Any, Final

from jobsight.collector.store.db import Connection

JOB_XIDS_LIMIT: Final = 200
"""Xids a job's timeline reads at most, the first ones: a GPU that keeps failing can report one a
second, and past a few hundred rules the chart says nothing more."""


def job_xids(conn: Connection, cluster: str, job_id: str, limit: int = JOB_XIDS_LIMIT) -> list[dict[str, Any]]:
    """The job's Xid errors, oldest first: when, on which node and GPU, and the Xid's number (every
    Xid, the application's own ones too: on its own job's page they say what its program hit)."""
    return conn.execute(
        """SELECT ts, node, gpu_index, gpu_uuid, code FROM gpu_events
           WHERE job_id = %s AND cluster = %s AND event = 'xid'
           ORDER BY ts, node, gpu_index LIMIT %s""",
        (job_id, cluster, limit),
    ).fetchall()
