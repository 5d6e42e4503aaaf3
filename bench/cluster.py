"""Cluster simulator: how many 8-GPU nodes one collector host holds, sampling at 1 Hz.

    .venv/bin/python bench/cluster.py [--nodes-max 8000] [--step-s 45] [--workers 2] [--quick]

Starts its own stack (bench/stack.py: embedded PostgreSQL + ``jobsight collector --workers
N``), registers the jobs (``job_started`` with the admin token, one job per group of
``--nodes-per-job`` nodes), then ramps the number of simulated node daemons through
``--ladder`` up to ``--nodes-max``, holding each step ``--step-s`` seconds. Every simulated
node runs the project's own shipper with the node daemon's default settings (its own url,
node token, spool dir and name) and sends 8 GPUs' ``gpu_sample`` and one ``host_sample`` a
second; ``--trainers`` training processes (threads, each with its own shipper, as a process
has) send steps and log lines through the real log handler (bench/cluster_load.py). The load
runs in ``--procs`` processes of many nodes each, so the generator is not the collector's
bottleneck; its own CPU is printed too.

The ramp stops at the first step where the collector's p99 ingest latency passes 1 s, a
record is lost (dropped, refused or quarantined by a shipper), a node has had batches in its
spool for more than 10 s, or the load generator itself falls behind (then the figure is the
machine's, not the collector's). Per step it prints: nodes, GPU samples/s stored, requests/s,
p50/p99 ingest latency measured in the collector (the /metrics histogram
``jobsight_ingest_batch_seconds``, from the start of a request's handler to its batch
committed, interpolated in its buckets) and by the shippers (post round trips, exact), the
collector's and PostgreSQL's CPU (utime+stime of their process trees from /proc, in cores),
and bytes per GPU sample on disk (gpu_samples partitions + gpu_minutes, indexes and TOAST
included). At the end it counts in the database what each simulated node and trainer sent
against what was stored, and duplicate GPU samples by (job, node, gpu_index, ts).

With ``--pack``, the previous UTC hour is first filled with ``--pack-minutes`` of what every node
would have sent in it (bench/cluster_seed.py), and the top step runs the hourly compaction pass
on it while the nodes stream the current hour; the step is measured until the pass ends, and the
pass's work and time are printed under it. (Its deleted rows stay in gpu_samples as dead space
until autovacuum: the step's bytes per sample include them.)

Figures depend on the machine (and on what else runs on it): compare steps of one run.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import resource
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import cluster_probe as probe  # noqa: E402
from bench.cluster_load import LoadConfig, NodeSpec, TrainerSpec  # noqa: E402
from bench.cluster_pool import LoadPool  # noqa: E402
from bench.cluster_seed import PackingPass, Seed, seed_previous_hour  # noqa: E402
from bench.cluster_steps import HEADER, Reading, Step, measure, ms, row, unanswered  # noqa: E402
from bench.stack import Stack, running_stack  # noqa: E402
from jobsight.agent.settings import AgentSettings  # noqa: E402
from jobsight.agent.shipping.shipper import Shipper  # noqa: E402
from jobsight.commands.agent import DAEMON_BATCH_AGE_S  # noqa: E402
from jobsight.protocol.tokens import mint_job_token, mint_node_token, read_cluster_secret  # noqa: E402
from jobsight.protocol.wire import now_us  # noqa: E402

LADDER = (100, 250, 500, 1000, 1500, 2000, 3000, 4000, 6000, 8000, 12000, 16000)
QUICK_LADDER = (25, 50)
CLUSTER = "default"
# The last line of a traceback: a dotted class name (starlette.requests.ClientDisconnect) or a
# builtin one (TimeoutError: ...).
EXCEPTION_LINE = re.compile(r"^(?:[a-z_]\w*\.)+[A-Z]\w*(?::|$)|^[A-Z]\w*(?:Error|Exception|Timeout|Exit)\b")


# -- the simulated cluster --------------------------------------------------------------

@dataclass
class Cluster:
    nodes: list[NodeSpec]
    trainers: list[TrainerSpec]
    jobs: dict[str, list[str]]
    """Job id -> its nodes."""


def plan(stack: Stack, nodes_max: int, nodes_per_job: int, trainers: int) -> Cluster:
    secret = read_cluster_secret(str(stack.secret_file))
    run = f"{now_us() // 1_000_000 % 100000:05d}"
    jobs: dict[str, list[str]] = {}
    nodes: list[NodeSpec] = []
    for index in range(nodes_max):
        name = f"gpu{index:05d}"
        job = f"{run}{index // nodes_per_job:05d}"  # Slurm-like numeric job ids
        jobs.setdefault(job, []).append(name)
        # A node token, as the daemon mints: the collector checks every batch against the allocation.
        nodes.append(NodeSpec(name, job, mint_node_token(secret, CLUSTER, name), str(stack.work / "spool" / name)))
    job_ids = list(jobs)
    trainer_specs = []
    for index in range(trainers):
        job = job_ids[index % len(job_ids)]
        node = jobs[job][index // len(job_ids) % len(jobs[job])]
        trainer_specs.append(TrainerSpec(f"train{index:03d}", job, node, index // len(job_ids),
                                         mint_job_token(secret, CLUSTER, job, 86400, uid=job_uid(job_ids.index(job))),
                                         str(stack.work / "spool" / f"train{index:03d}")))
    return Cluster(nodes, trainer_specs, jobs)


def job_uid(number: int) -> int:
    """The uid job ``number`` runs as: its prolog record says so, and its trainers' job tokens are minted
    for it (the collector refuses a job token of another uid)."""
    return 20000 + number % 97


def register_jobs(stack: Stack, jobs: dict[str, list[str]]) -> None:
    """Every job's prolog record (with the admin token): the allocation node tokens are checked against."""
    settings = AgentSettings(url=stack.url, token=stack.token, node="bench-prolog",
                             spool_dir=str(stack.work / "spool" / "prolog"))
    shipper = Shipper(settings)
    ts = now_us()
    for number, (job, nodes) in enumerate(jobs.items()):
        shipper.enqueue({"kind": "job_started", "job": job, "ts": ts, "node": nodes[0],
                         "user": f"user{number % 97:02d}", "uid": job_uid(number),
                         "account": f"proj{number % 13:02d}", "partition": "gpu", "name": f"train-{number}",
                         "nodes": nodes, "node_count": len(nodes), "gpus": [str(i) for i in range(8)],
                         "time_limit_s": 86400})
    done = shipper.flush(120)
    stats = shipper.stats()
    shipper.shutdown(5)
    if not done or stats["rejected_batches"] or stats["dropped_records"]:
        raise SystemExit(f"registering the jobs failed: {stats}")


def read_now(stack: Stack, pool: LoadPool, roots: list[int]) -> Reading:
    return Reading(time.monotonic(), probe.scrape(stack.url), probe.tree_cpu_seconds(roots), pool.mark())


# -- the run ----------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes-max", type=int, default=8000, help="the last step (default 8000)")
    parser.add_argument("--ladder", default=",".join(map(str, LADDER)),
                        help="node counts to step through, comma separated (default %(default)s)")
    parser.add_argument("--step-s", type=float, default=45.0, help="seconds each step is measured (default 45)")
    parser.add_argument("--settle-s", type=float, default=None,
                        help="seconds after adding nodes before measuring (default 2 x batch age + 2)")
    parser.add_argument("--workers", type=int, default=2, help="collector worker processes (default 2)")
    parser.add_argument("--procs", type=int, default=4, help="load generator processes (default 4)")
    parser.add_argument("--nodes-per-job", type=int, default=4, help="nodes of each simulated job (default 4)")
    parser.add_argument("--trainers", type=int, default=32, help="simulated training processes (default 32)")
    parser.add_argument("--train-hz", type=float, default=2.0, help="steps (and log lines) per second per trainer")
    parser.add_argument("--batch-age-s", type=float, default=DAEMON_BATCH_AGE_S,
                        help=f"the node daemons' batch age (default: the daemon's, {DAEMON_BATCH_AGE_S:g})")
    parser.add_argument("--citus", action="store_true",
                        help="run the ladder twice, on Debian's PostgreSQL 15 alone and on a 3-node Citus cluster of "
                             "it (a coordinator and two workers on this machine), and print both")
    parser.add_argument("--pack", action="store_true",
                        help="run the hourly compaction pass during the top step, on a previous hour seeded first")
    parser.add_argument("--pack-minutes", type=int, default=60,
                        help="minutes of the previous hour --pack fills for every node (default 60: a whole hour)")
    parser.add_argument("--quick", action="store_true",
                        help="a one-minute smoke run: 25 then 50 nodes, 15 s each, 2 trainers, 2 load processes")
    args = parser.parse_args(argv)
    if args.quick:
        args.ladder, args.step_s, args.trainers, args.procs = ",".join(map(str, QUICK_LADDER)), 15.0, 2, 2
        args.nodes_max = min(args.nodes_max, QUICK_LADDER[-1])
    args.steps = [n for n in (int(v) for v in args.ladder.split(",") if v.strip()) if 0 < n <= args.nodes_max]
    if not args.steps:
        parser.error("no step of --ladder is within --nodes-max")
    if args.settle_s is None:
        # New nodes start within one batch age and send their first batch one batch age later.
        args.settle_s = 2 * args.batch_age_s + 2.0
    return args


def raise_file_limit() -> None:
    """Each simulated node keeps a connection open, and the collector (our child) serves them all."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@dataclass
class Outcome:
    """One ladder's result, for the side-by-side of ``--citus``."""

    database: str
    held: int
    p99_s: float
    lost: int
    duplicated: int


def run(args: argparse.Namespace) -> int:
    raise_file_limit()
    print(f"cluster: steps {args.steps} nodes x 8 GPUs at 1 Hz, {args.step_s:g} s each; node batch age "
          f"{args.batch_age_s:g} s; {args.trainers} trainers at {args.train_hz:g} Hz; collector --workers "
          f"{args.workers}; {args.procs} load processes", flush=True)
    if not args.citus:
        return run_on(args, "embedded")[0]
    outcomes = []
    code = 0
    for database in ("pg15", "citus"):
        print(f"\n== {DATABASES[database]} ==", flush=True)
        result, outcome = run_on(args, database)
        code |= result
        outcomes.append(outcome)
    print(f"\n{'database':<44} {'nodes held':>10} {'p99 ms':>8} {'lost':>6} {'duplicated':>10}")
    for each in outcomes:
        print(f"{DATABASES[each.database]:<44} {each.held:>10} {ms(each.p99_s):>8} {each.lost:>6} "
              f"{each.duplicated:>10}")
    single, citus = outcomes
    if single.held:
        print(f"Citus / single server: nodes held {citus.held / single.held:.2f}, p99 "
              f"{citus.p99_s / single.p99_s:.2f}x" if single.p99_s else "")
    return code


DATABASES = {"embedded": "embedded PostgreSQL", "pg15": "PostgreSQL 15, one server",
             "citus": "Citus 13 on PostgreSQL 15: coordinator + 2 workers"}


def run_on(args: argparse.Namespace, database: str) -> tuple[int, Outcome]:
    started = time.monotonic()
    with running_stack(workers=args.workers, database=database) as stack:
        cluster = plan(stack, args.steps[-1], args.nodes_per_job, args.trainers)
        register_jobs(stack, cluster.jobs)
        print(f"stack up and {len(cluster.jobs)} jobs registered in {time.monotonic() - started:.0f} s", flush=True)
        seed = None
        if args.pack:
            seed = seed_previous_hour(stack.database_url, cluster.jobs, args.pack_minutes)
            print(f"previous hour seeded for the pass: {seed.gpu_samples:,} GPU samples, {seed.host_samples:,} host "
                  f"samples, their minutes, until {seed.until:%H:%M} UTC, in {seed.seconds:.0f} s", flush=True)
        pool = LoadPool(args.procs, LoadConfig(stack.url, args.batch_age_s, args.train_hz))
        try:
            code, outcome = ramp(stack, pool, cluster, args, seed)
            outcome.database = database
            return code, outcome
        finally:
            if any(p.is_alive() for p in pool.processes):
                for process in pool.processes:
                    process.kill()
            summarise_log(stack.work / "collector.log")


def summarise_log(log: Path) -> None:
    """The collector's errors by exception, and a copy of its log (the stack's folder goes away)."""
    lines = log.read_text(errors="replace").splitlines()
    tracebacks = sum(1 for line in lines if line.startswith("Traceback"))
    if not tracebacks:
        return
    # A traceback ends with "module.Error: message" at the start of a line.
    ends = Counter(line.split(":", 1)[0] for line in lines if EXCEPTION_LINE.match(line))
    kept = Path(tempfile.gettempdir()) / f"jobsight-cluster-collector-{os.getpid()}.log"
    shutil.copyfile(log, kept)
    common = ", ".join(f"{name} x{count}" for name, count in ends.most_common(4))
    print(f"collector log: {tracebacks} tracebacks ({common}); kept in {kept}")


def ramp(stack: Stack, pool: LoadPool, cluster: Cluster, args: argparse.Namespace,
         seed: Seed | None = None) -> tuple[int, Outcome]:
    assert stack.process is not None
    roots = {"collector": [stack.process.pid], "postgres": stack.postgres_pids(), "load": pool.pids()}
    every_root = [pid for pids in roots.values() for pid in pids]
    pool.add([], cluster.trainers)
    print(HEADER, flush=True)
    steps: list[Step] = []
    held = 0
    added = 0
    packing = None
    for target in args.steps:
        pool.add(cluster.nodes[added:target], [])
        added = target
        time.sleep(args.settle_s)  # the newcomers' first batches, connections, spools
        try:
            before = read_now(stack, pool, every_root)
            if seed is not None and target == args.steps[-1]:
                packing = PackingPass(stack.database_url, seed.until)
                packing.start()
            time.sleep(args.step_s)
            while packing is not None and packing.running():  # the step lasts as long as the pass
                time.sleep(1.0)
            after = read_now(stack, pool, every_root)
        except OSError as exc:  # /metrics unanswered: the collector is drowning
            step = unanswered(target, f"COLLECTOR UNRESPONSIVE (/metrics: {exc})")
        else:
            step = measure(stack.database_url, target, before, after, roots,
                           after.metrics.records.get("gpu_sample", 0.0))
        steps.append(step)
        print(row(step), flush=True)
        if packing is not None and target == args.steps[-1]:
            print(f"  {packing.describe()}", flush=True)
        if step.verdict != "ok":
            break
        held = target
    final = pool.stop(flush_timeout_s=60.0)
    failed_pass = packing is not None and (packing.error is not None or packing.report is None)
    code, outcome = report(stack, steps, held, final, seed)
    return (1 if failed_pass else code), outcome


def report(stack: Stack, steps: list[Step], held: int, final: dict[str, Any],
           seed: Seed | None = None) -> tuple[int, Outcome]:
    stored = probe.stored(stack.database_url, since=seed.until if seed else None)
    expected = {"gpu_samples": final["gpu_records"], "host_samples": final["host_records"],
                "steps": final["steps"], "log lines": final["logs"]}
    found = {"gpu_samples": stored.gpu_samples, "host_samples": stored.host_samples,
             "steps": stored.steps, "log lines": stored.logs}
    last = steps[-1]
    print()
    if last.verdict == "ok":
        print(f"held {held} nodes ({held * 8} GPUs) at every step; the ladder ended before a limit was reached")
    else:
        print(f"held {held} nodes ({held * 8} GPUs); at {last.nodes}: {last.verdict}")
    ok_steps = [s for s in steps if s.verdict == "ok"] or steps
    best = max(ok_steps, key=lambda s: 0.0 if math.isnan(s.stored_per_s) else s.stored_per_s)
    print(f"at {best.nodes} nodes: {best.stored_per_s:,.0f} GPU samples/s stored, "
          f"{best.requests_per_s:,.0f} requests/s, p50/p99 {ms(best.p50_s)}/{ms(best.p99_s)} ms in the collector, "
          f"{ms(best.client_p50_s)}/{ms(best.client_p99_s)} ms at the shippers; collector "
          f"{best.collector_cores:.2f} cores, PostgreSQL {best.postgres_cores:.2f} cores, load generator "
          f"{best.load_cores:.2f} cores")
    rows = max(stored.gpu_samples, 1)
    print(f"bytes per GPU sample: {stored.gpu_bytes / rows:.0f} in gpu_samples + {stored.minute_bytes / rows:.0f} "
          f"in gpu_minutes = {(stored.gpu_bytes + stored.minute_bytes) / rows:.0f} ({stored.gpu_samples:,} samples)")
    problems = 0
    lost_all = extra_all = 0
    for kind, want in expected.items():
        got = found[kind]
        lost, extra = max(0, want - got), max(0, got - want)
        problems += lost + extra
        lost_all, extra_all = lost_all + lost, extra_all + extra
        print(f"{kind:>13}: sent {want:,}, stored {got:,}, lost {lost:,}, extra {extra:,}")
    problems += stored.gpu_sample_duplicates
    print(f"duplicate GPU samples by (job, node, gpu_index, ts): {stored.gpu_sample_duplicates:,}; "
          f"shippers: dropped {final['dropped_records']}, refused batches {final['rejected_batches']}, "
          f"quarantined {final['quarantined_batches']}, spooled batches {final['spooled_batches']}, "
          f"all flushed at the end: {final['flushed']}")
    held_steps = [s for s in steps if s.nodes == held]
    outcome = Outcome("", held, held_steps[-1].p99_s if held_steps else math.nan, lost_all,
                      extra_all + stored.gpu_sample_duplicates)
    return (1 if problems else 0), outcome


def main() -> None:
    sys.exit(run(parse_args()))


if __name__ == "__main__":
    main()
