"""A Citus worker killed under a steady stream of batches is an outage, not an error: the collector
answers 503 (with ``Retry-After``) while the shards it holds are away, never 500, says the outage once
when it begins and once when it ends, and every sample is stored exactly once after the worker is back.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.shipper import Shipper
from jobsight.protocol.wire import now_us
from tests.citus.cluster import CitusCluster, skip_or_fail_without_citus, start_citus_cluster
from tests.citus.test_citus import _migrate
from tests.conftest import LiveCollector

JOBS = 24
"""Jobs enough that some have their shards on the killed worker."""
TICKS = 120
DOWN_S = 12.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CitusCluster]:
    skip_or_fail_without_citus()
    base = tmp_path_factory.mktemp("citus-outage")
    base.chmod(0o755)
    started = start_citus_cluster(base)
    try:
        _migrate(started.url, "--citus")
        yield started
    finally:
        started.destroy()


def _kill(server: Any) -> None:
    pid = int((server.data_dir / "postmaster.pid").read_text().splitlines()[0])
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def _record(job: int, tick: int, t0: int) -> dict[str, Any]:
    return {"kind": "gpu_sample", "job": f"outage-{job}", "ts": t0 + tick * 1_000_000, "node": "cn0",
            "gpu_index": 0, "gpu_uuid": "GPU-outage", "util_gpu": float(tick % 100), "power_w": 300.0}


def test_a_killed_worker_is_answered_503_and_nothing_is_lost(cluster: CitusCluster, data_dir: Path,
                                                            admin_token: str, tmp_path: Path) -> None:
    log_file = tmp_path / "collector.log"
    collector = LiveCollector(cluster.url, data_dir, admin_token, log_file,
                              env={"JOBSIGHT_COMPACT_INTERVAL_S": "0", "JOBSIGHT_HEALTH_INTERVAL_S": "0"})
    collector.start()
    settings = AgentSettings(url=collector.url, token=collector.token, spool_dir=str(tmp_path / "spool"), node="cn0",
                             batch_age_s=0.05, batch_records=JOBS * 2, http_timeout_s=30.0)
    shipper = Shipper(settings)
    t0 = now_us() - 3600 * 1_000_000
    try:
        def stream() -> None:  # a tick of every job each 0.25 s, as node daemons would
            for tick in range(TICKS):
                for job in range(JOBS):
                    shipper.enqueue(_record(job, tick, t0))
                time.sleep(0.25)

        sender = threading.Thread(target=stream)
        sender.start()
        time.sleep(5.0)
        _kill(cluster.workers[1])
        time.sleep(DOWN_S)
        cluster.workers[1].start()
        sender.join()
        assert shipper.flush(180.0), shipper.stats()
        stats = shipper.stats()
    finally:
        shipper.shutdown(10.0)
        collector.kill()
    with psycopg.connect(cluster.url) as conn:
        stored = conn.execute("SELECT count(*), count(DISTINCT (job_id, ts)) FROM gpu_samples "
                              "WHERE job_id LIKE 'outage-%'").fetchone()
    assert stored == (JOBS * TICKS, JOBS * TICKS)  # every sample, each once
    assert stats.get("rejected", 0) == 0, stats
    said = log_file.read_text(errors="replace")
    assert "Traceback" not in said and "internal error" not in said and " 500 " not in said, said[-3000:]
    assert said.count("database unavailable, answering 503") == 1, said[-3000:]
    assert said.count("database back after") == 1, said[-3000:]
    assert "pass skipped" not in said, said[-3000:]  # the passes that met it say nothing more
