"""Thirty days of finished simulated jobs, written once by ``jobsight up --demo``.

So that the audit pages and trends have something to show on the first visit, a few users of
a few accounts ran jobs on the ``simulated`` cluster's partitions over the past ``days``: most
of them trained well, some were input-bound (low utilisation), some held GPUs they did not use
(an interactive session left open), and some were short debug runs. Each job is a batch of
what the Slurm prolog, the node daemon and the epilog would have sent (``job_started`` per
node, a ``gpu_sample`` per GPU every :data:`SAMPLE_EVERY_S`, ``job_ended``), marked ``demo``
and named ``simulated: …``.

The wire refuses records older than a week, so these batches do not go through the HTTP API:
they are validated with the wire's own checks (at the time each job ended) and stored by the
collector's ingest writer (:func:`jobsight.collector.ingest.write.store_group`), in one transaction,
which builds the rollups and the job summaries exactly as ingest does. The batches carry the
source :data:`SOURCE`; when a batch of it is already stored, nothing is written again.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from typing import Any, Final

import psycopg
from psycopg.rows import dict_row

from jobsight.agent.node.gpu.simulated import IDLE_W, MEMORY_TOTAL, NAME, TDP_W, gpu_uuid
from jobsight.collector.ingest import write as ingest
from jobsight.collector.store.migrate import libpq_url
from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.commands.demo_story import CLUSTER, GPUS_PER_NODE, us
from jobsight.protocol.wire import Batch, decode_batch

SOURCE: Final = "simulated:history"
SAMPLE_EVERY_S: Final = 300
"""Coarse samples (one every 5 minutes per GPU): enough for the audit, and written in seconds."""
NODES: Final = tuple(f"sim-gpu{n:02d}" for n in range(1, 9))
USERS: Final = (("ana", "nlp"), ("bruno", "climate"), ("chen", "physics"), ("dara", "nlp"), ("eli", "bio"))
WORK: Final = {"nlp": ("llm-pretrain", "bert-finetune", "tokenizer-eval"),
               "climate": ("unet-downscaling", "forecast-ensemble"),
               "physics": ("lattice-gnn", "jet-tagging"), "bio": ("protein-fold", "cryoem-denoise")}


@dataclass(frozen=True)
class HistoryJob:
    """One finished simulated job."""

    job_id: str
    user: str
    account: str
    partition: str
    name: str
    start_s: float
    end_s: float
    gpus: tuple[tuple[str, int], ...]
    """(node, GPU index) of every allocated GPU."""
    util: float
    """Mean GPU utilisation the job ran at."""
    mem_share: float
    """Share of each GPU's memory it held."""
    state: str
    exit_code: int | None


# kind -> (share of jobs, partitions, GPU counts, hours, utilisation range, memory share range)
_KINDS: Final[dict[str, tuple[float, tuple[str, ...], tuple[int, ...], tuple[float, float], tuple[float, float],
                              tuple[float, float]]]] = {
    "training": (0.62, ("gpu", "gpu", "gpu-long"), (4, 8, 8, 16), (2.0, 14.0), (72.0, 95.0), (0.45, 0.9)),
    "input-bound": (0.15, ("gpu",), (2, 4, 8), (2.0, 8.0), (12.0, 27.0), (0.3, 0.6)),
    "idle": (0.11, ("gpu",), (1, 2, 4), (3.0, 10.0), (0.3, 3.0), (0.02, 0.08)),
    "debug": (0.12, ("debug",), (1, 2), (0.2, 1.0), (30.0, 70.0), (0.1, 0.5)),
}


def _state(rng: random.Random) -> tuple[str, int | None]:
    roll = rng.random()
    if roll < 0.76:
        return "completed", 0
    if roll < 0.86:
        return "failed", 1
    return ("timeout", None) if roll < 0.95 else ("cancelled", None)


def plan(now_s: float, days: int, seed: int = 0) -> list[HistoryJob]:
    """The jobs of the ``days`` before ``now_s``: one to three starting each day, all ended an hour before now."""
    rng = random.Random(seed)
    jobs: list[HistoryJob] = []
    kinds = list(_KINDS)
    for day in range(days, 0, -1):
        for _ in range(rng.randint(1, 3)):
            kind = rng.choices(kinds, weights=[_KINDS[k][0] for k in kinds])[0]
            _, partitions, counts, hours, util, memory = _KINDS[kind]
            start = now_s - day * 86_400 + rng.uniform(0, 20 * 3600)
            end = min(start + rng.uniform(*hours) * 3600, now_s - 3600)
            if end - start < 2 * SAMPLE_EVERY_S:
                continue
            user, account = rng.choice(USERS)
            count = rng.choice(counts)
            first = rng.randrange(len(NODES) - 1)
            if count > GPUS_PER_NODE:
                gpus = tuple((NODES[first + i // GPUS_PER_NODE], i % GPUS_PER_NODE) for i in range(count))
            else:
                offset = rng.randrange(GPUS_PER_NODE - count + 1)
                gpus = tuple((NODES[first], offset + i) for i in range(count))
            work = "jupyter session" if kind == "idle" else rng.choice(WORK[account])
            state, exit_code = ("completed", 0) if kind == "idle" else _state(rng)
            jobs.append(HistoryJob(f"sim-h{len(jobs) + 1:03d}", user, account, rng.choice(partitions),
                                   f"simulated: {work}", start, end, gpus, rng.uniform(*util),
                                   rng.uniform(*memory), state, exit_code))
    return jobs


def records(job: HistoryJob, seed: int = 0) -> list[dict[str, Any]]:
    """What the prologs, node daemons and epilog of ``job`` would have sent."""
    rng = random.Random(f"{seed}:{job.job_id}")
    nodes = sorted({node for node, _ in job.gpus})
    out: list[dict[str, Any]] = [{
        "kind": "job_started", "job": job.job_id, "ts": us(job.start_s), "node": node, "user": job.user,
        "account": job.account, "partition": job.partition, "name": job.name, "nodes": nodes,
        "node_count": len(nodes), "gpus": [str(i) for n, i in job.gpus if n == node], "demo": True,
        "attrs": {"simulated": True},
    } for node in nodes]
    energy = {gpu: rng.uniform(1e8, 5e8) for gpu in job.gpus}
    times = [job.start_s + k * SAMPLE_EVERY_S for k in range(int((job.end_s - job.start_s) // SAMPLE_EVERY_S) + 1)]
    for t in times:
        for node, index in job.gpus:
            spread = 1.0 if job.util < 5 else 6.0
            util = min(100.0, max(0.0, rng.gauss(job.util, spread)))
            power = max(IDLE_W * 0.9, IDLE_W + (TDP_W - IDLE_W) * util / 100 * 0.9 + rng.gauss(0.0, 8.0))
            energy[(node, index)] += power * SAMPLE_EVERY_S
            out.append({
                "kind": "gpu_sample", "job": job.job_id, "ts": us(t), "node": node, "gpu_index": index,
                "gpu_uuid": gpu_uuid(node, index), "gpu_name": NAME, "util_gpu": round(util, 1),
                "util_mem": round(util * 0.45, 1), "mem_used": int(job.mem_share * MEMORY_TOTAL),
                "mem_total": MEMORY_TOTAL, "power_w": round(power, 1), "energy_j": round(energy[(node, index)], 3),
                "temp_c": float(round(32 + 48 * power / TDP_W)), "process_count": 1, "lost": False,
            })
    out.append({"kind": "job_ended", "job": job.job_id, "ts": us(job.end_s), "node": nodes[0], "state": job.state,
                "exit_code": job.exit_code})
    return out


def _batch(seq: int, job: HistoryJob, seed: int) -> Batch:
    """The job's batch, checked by the wire's rules as the collector would have checked it when the job ended."""
    body = json.dumps({"v": 1, "source": SOURCE, "seq": seq, "sent_at": job.end_s, "cluster": CLUSTER,
                       "records": records(job, seed)}).encode()
    return decode_batch(body, now=us(job.end_s + 60))


def already_written(conn: psycopg.Connection[Any]) -> bool:
    return conn.execute("SELECT 1 FROM ingest_batches WHERE source = %s LIMIT 1", (SOURCE,)).fetchone() is not None


def write_history(database_url: str, days: int, *, now_s: float | None = None, seed: int = 0) -> int:
    """Write the history once; returns the number of jobs written (0: it was there already)."""
    jobs = plan(time.time() if now_s is None else now_s, days, seed)
    with psycopg.connect(libpq_url(database_url), row_factory=dict_row, autocommit=True) as conn:
        if not jobs or already_written(conn):
            return 0
        keeper = PartitionKeeper()
        keeper.load(conn)
        items = []
        for seq, job in enumerate(jobs):
            batch = _batch(seq, job, seed)
            prepared = ingest.prepare(batch)
            ingest.ensure_partitions(conn, keeper, prepared)
            items.append((batch, prepared))
        with conn.transaction():
            written = ingest.store_group(conn, items)
    return sum(written.stored)
