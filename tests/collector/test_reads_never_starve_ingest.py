"""Reads never starve ingest (docs/security.md): ingest keeps its own connections, and every read a
token can start is bounded in cost (epochs per read) and in time (the read statement timeout).

The reads are held in the database, not mocked: the test takes PostgreSQL's ACCESS EXCLUSIVE lock
on ``epoch_starts``, which every epochs read needs and node ingest of GPU samples does not, so the
8 reads stay running (waiting on the lock, each holding its connection) for exactly as long as the
test says. Before the read pool, those 8 held every connection of the collector's one pool, and
node ingest answered 503 "database unavailable" until they ended.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from jobsight.protocol.tokens import mint_job_token, mint_node_token
from jobsight.protocol.wire import encode_batch, now_us
from tests.collector.helpers import SECRET, next_seq
from tests.conftest import LiveCollector

S = 1_000_000
READS = 8  # the pool's size before reads had their own
EPOCHS = 1_500  # more than a read lists (max_epochs_per_read, 1,000 by default)
INGESTS = 10


def _post(url: str, token: str, records: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(f"{url}/v1/ingest", content=encode_batch("starve", next_seq(), records), timeout=120,
                      headers={"Content-Encoding": "gzip", "Authorization": f"Bearer {token}"})


def _heavy_job(job: str, t0: int) -> list[dict[str, Any]]:
    """A registered job with many epochs (a step each, a second apart) and GPU samples with energy
    counters every 5 s over them."""
    records: list[dict[str, Any]] = [
        {"kind": "job_started", "job": job, "ts": t0, "node": "n1", "user": "alice", "nodes": ["n1"], "gpus": ["0"]}]
    records += [{"kind": "step", "job": job, "ts": t0 + (1 + e) * S, "node": "n1", "rank": 0, "step": e, "epoch": e,
                 "phase": "train", "duration_s": 1.0, "samples": 32} for e in range(EPOCHS)]
    records += [{"kind": "gpu_sample", "job": job, "ts": t0 + i * 5 * S, "node": "n1", "gpu_index": 0,
                 "gpu_uuid": "GPU-starve", "util_gpu": 90.0, "power_w": 300.0, "energy_j": 1500.0 * i}
                for i in range(EPOCHS // 5 + 2)]
    return records


def _waiting_on_the_lock(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        """SELECT count(*) FROM pg_stat_activity
           WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%%FROM epoch_starts%%'
             AND pid <> pg_backend_pid()""").fetchone()
    return int(row[0]) if row else 0


@pytest.fixture
def start_collector(database_url: str, data_dir: Path, admin_token: str,
                    tmp_path: Path) -> Iterator[Callable[[dict[str, str]], LiveCollector]]:
    """Starts a collector process with the tests' cluster secret (job and node tokens) and ``env``."""
    secret_file = tmp_path / "cluster_secret"
    secret_file.write_text(SECRET)
    os.chmod(secret_file, 0o600)
    started: list[LiveCollector] = []

    def start(env: dict[str, str]) -> LiveCollector:
        live = LiveCollector(database_url, data_dir, admin_token, tmp_path / "collector.log",
                             env={"JOBSIGHT_SECRET_FILE": str(secret_file), **env})
        started.append(live)
        live.start()
        return live

    yield start
    for live in started:
        live.kill()


def _seeded(collector: LiveCollector, admin_token: str) -> tuple[str, str]:
    """A heavy job stored through ``collector``: its id and a job token for it."""
    job = f"starve-{uuid.uuid4().hex[:10]}"
    seed = _heavy_job(job, now_us() - (EPOCHS + 60) * S)
    for i in range(0, len(seed), 5000):
        assert _post(collector.url, admin_token, seed[i:i + 5000]).status_code == 200
    return job, mint_job_token(SECRET, "default", job, 3600)


def _epochs_read(collector: LiveCollector, job: str, token: str) -> Callable[[], httpx.Response]:
    return lambda: httpx.get(f"{collector.url}/v1/jobs/{job}/epochs", timeout=300,
                             headers={"Authorization": f"Bearer {token}"})


def test_eight_heavy_reads_at_once_leave_node_ingest_answering(
    start_collector: Callable[[dict[str, str]], LiveCollector], database_url: str, admin_token: str
) -> None:
    """Eight epochs reads in the database at once (every turn a process gives heavy reads, set to 8
    here, and a read timeout past the test's length: the test ends the reads itself)."""
    collector = start_collector({"JOBSIGHT_HEAVY_READS": str(READS), "JOBSIGHT_READ_STATEMENT_TIMEOUT_S": "300"})
    job, job_token = _seeded(collector, admin_token)
    node_token = mint_node_token(SECRET, "default", "n1")
    epochs = _epochs_read(collector, job, job_token)

    with psycopg.connect(database_url) as lock, ThreadPoolExecutor(READS) as readers:
        lock.execute("LOCK TABLE epoch_starts IN ACCESS EXCLUSIVE MODE")  # held until the rollback below
        reads: list[Future[httpx.Response]] = [readers.submit(epochs) for _ in range(READS)]
        with psycopg.connect(database_url, autocommit=True) as watch:
            deadline = time.monotonic() + 60  # a limit on the wait, not a timed assert
            while _waiting_on_the_lock(watch) < READS:  # every read holds a connection in the database
                assert not any(r.done() for r in reads), [r.result().text for r in reads if r.done()]
                assert time.monotonic() < deadline, f"only {_waiting_on_the_lock(watch)} reads reached the database"
                time.sleep(0.05)
        answers = []
        for i in range(INGESTS):
            sample = {"kind": "gpu_sample", "job": job, "ts": now_us(), "node": "n1", "gpu_index": 0,
                      "gpu_uuid": "GPU-starve", "util_gpu": 50.0 + i}
            answers.append(_post(collector.url, node_token, [sample]))
            if answers[-1].status_code != 200:
                break  # one is enough: under the old pool each waited 5 s for a connection
        reads_running = [not r.done() for r in reads]
        lock.rollback()
        read_answers = [r.result() for r in reads]

    assert [a.status_code for a in answers] == [200] * INGESTS, answers[-1].text
    assert all(reads_running)  # the ingests were answered while every read was still in the database
    for answer in read_answers:  # and once the lock went, every read answered in full, bounded
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert len(body["epochs"]) == 1000 and body["epoch_count"] == EPOCHS
        assert body["epochs_left_out"]["epochs"] == EPOCHS - 1000


def _cpu_and_nice(pid: int) -> tuple[float, int]:
    """A process's user + system CPU seconds and its nice value, from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[16])


def _workers(pid: int) -> list[int]:
    """The heavy-read workers ``pid`` started (``python -m jobsight.collector.query.read_worker``)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid \
                    and b"jobsight.collector.query.read_worker" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_heavy_reads_work_in_processes_of_lower_priority_than_ingest(
    start_collector: Callable[[dict[str, str]], LiveCollector], admin_token: str
) -> None:
    """The CPU of the epochs reads is spent in the collector's read workers, processes whose nice is
    raised (``heavy_read_niceness``, 10), not in the process that answers ingest: its interpreter lock
    and its core stay ingest's (bench/read_pressure.py measures the latency this keeps). Before, every
    read's Python work ran in the ingest process and there were no such processes."""
    collector = start_collector({"JOBSIGHT_HEAVY_READS": "2"})
    assert collector.process is not None
    job, job_token = _seeded(collector, admin_token)
    epochs = _epochs_read(collector, job, job_token)
    assert epochs().status_code == 200  # the first read starts a worker (its start-up is not a read's cost)
    workers = _workers(collector.process.pid)
    assert workers, "no read worker process beside the collector"
    assert all(_cpu_and_nice(w)[1] >= 10 for w in workers), [_cpu_and_nice(w) for w in workers]

    main_before = _cpu_and_nice(collector.process.pid)[0]
    workers_before = sum(_cpu_and_nice(w)[0] for w in workers)
    for _ in range(10):
        answer = epochs()
        assert answer.status_code == 200 and len(answer.json()["epochs"]) == 1000
    main_spent = _cpu_and_nice(collector.process.pid)[0] - main_before
    workers_spent = sum(_cpu_and_nice(w)[0] for w in _workers(collector.process.pid) if w in workers) - workers_before
    assert workers_spent > main_spent, (workers_spent, main_spent)

    collector.process.kill()  # SIGKILL: no shutdown runs, and the workers still end with their collector
    collector.process.wait()
    deadline = time.monotonic() + 30  # a limit on the wait, not a timed assert
    while any(Path(f"/proc/{w}").exists() for w in workers):
        assert time.monotonic() < deadline, f"read workers {workers} outlived their collector"
        time.sleep(0.1)


def test_a_read_past_the_statement_timeout_is_503_naming_it(
    database_url: str, data_dir: Path, admin_token: str, job_id: str
) -> None:
    """A read the read statement timeout cancels answers 503 with Retry-After and says why, never 500; the
    read connection it used serves the next read."""
    from fastapi.testclient import TestClient

    from jobsight.collector.app import create_app
    from jobsight.collector.config.settings import load_collector_settings

    settings = load_collector_settings(database_url=database_url, data_dir=data_dir, read_statement_timeout_s=0.5,
                                       read_pool_size=1)
    with TestClient(create_app(settings)) as client:
        client.headers["Authorization"] = f"Bearer {admin_token}"
        started = {"kind": "job_started", "job": job_id, "ts": now_us(), "node": "n1"}
        stored = client.post("/v1/ingest", content=encode_batch("timeout", next_seq(), [started]),
                             headers={"Content-Encoding": "gzip"})
        assert stored.status_code == 200
        with psycopg.connect(database_url) as lock:
            lock.execute("LOCK TABLE epoch_starts IN ACCESS EXCLUSIVE MODE")
            answer = client.get(f"/v1/jobs/{job_id}/epochs")
            lock.rollback()
        assert answer.status_code == 503, answer.text
        assert "statement timeout" in answer.json()["detail"]["error"] and answer.headers["Retry-After"]
        again = client.get(f"/v1/jobs/{job_id}/epochs")
        assert again.status_code == 200 and again.json()["epochs"] == []


def test_heavy_reads_past_their_turns_wait_then_are_503(
    start_collector: Callable[[dict[str, str]], LiveCollector], database_url: str, admin_token: str
) -> None:
    """A process works on ``heavy_reads`` epochs reads at once (their CPU is the ingest process's): one
    more waits for a turn and, when none comes, answers 503 saying so, while the one at work goes on."""
    collector = start_collector({"JOBSIGHT_HEAVY_READS": "1", "JOBSIGHT_READ_STATEMENT_TIMEOUT_S": "300"})
    job, job_token = _seeded(collector, admin_token)
    epochs = _epochs_read(collector, job, job_token)
    with psycopg.connect(database_url) as lock, ThreadPoolExecutor(1) as reader:
        lock.execute("LOCK TABLE epoch_starts IN ACCESS EXCLUSIVE MODE")
        at_work = reader.submit(epochs)
        with psycopg.connect(database_url, autocommit=True) as watch:
            while _waiting_on_the_lock(watch) < 1:
                assert not at_work.done(), at_work.result().text
                time.sleep(0.05)
        refused = epochs()
        still_at_work = not at_work.done()
        lock.rollback()
        finished = at_work.result()
    assert refused.status_code == 503 and "too many heavy reads" in refused.text
    assert refused.headers["Retry-After"]
    assert still_at_work and finished.status_code == 200
