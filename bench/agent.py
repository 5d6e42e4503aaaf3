"""Agent-side costs, printed as numbers and ratios (not a test; CI does not run it).

    .venv/bin/python bench/agent.py [--records 100000] [--log-calls 100000] [--ticks 2000]

1. ``logging`` emit cost of :class:`jobsight.agent.training.logs.JobsightHandler` against the standard
   library's :class:`logging.handlers.QueueHandler`, in the same run (ratio).
2. Shipper throughput (records/s) to a live collector: this script starts its own
   embedded PostgreSQL, migrates it, and runs ``python -m jobsight collector``.
3. NVML sampler CPU seconds per GPU per tick (``time.process_time``) over the fake
   ``libnvidia-ml.so.1`` (needs gcc), and the node daemon's whole tick on top of it.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import logging.handlers
import os
import queue
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.stack import running_stack  # noqa: E402
from jobsight.agent.settings import AgentSettings  # noqa: E402
from jobsight.agent.shipping.shipper import Shipper  # noqa: E402
from jobsight.protocol.wire import now_us  # noqa: E402


def gpu_record(job: str, i: int) -> dict[str, Any]:
    return {
        "kind": "gpu_sample",
        "job": job,
        "ts": now_us(),
        "node": "bench",
        "gpu_index": i % 8,
        "gpu_uuid": f"GPU-{i % 8}",
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "util_gpu": 97.0,
        "util_mem": 40.0,
        "mem_used": 70 << 30,
        "mem_total": 80 << 30,
        "power_w": 650.5,
        "temp_c": 61.0,
        "sm_clock_mhz": 1980,
        "process_count": 1,
    }


def time_emits(handler: logging.Handler, calls: int) -> float:
    logger = logging.getLogger(f"bench.{type(handler).__name__}")
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    start = time.perf_counter()
    for i in range(calls):
        logger.info("step %d loss %.4f", i, 0.25)
    return (time.perf_counter() - start) / calls


def bench_log_handler(settings: AgentSettings, calls: int) -> None:
    try:
        from jobsight.agent.training.logs import JobsightHandler
    except ImportError:
        print("log handler: jobsight.agent.training.logs.JobsightHandler not available; skipped")
        return
    shipper = Shipper(settings)
    jobsight = JobsightHandler(settings=settings, shipper=shipper)
    stdlib = logging.handlers.QueueHandler(queue.SimpleQueue())
    time_emits(jobsight, 1000)  # warm up (context, worker start)
    time_emits(stdlib, 1000)
    ours = min(time_emits(jobsight, calls) for _ in range(3))
    theirs = min(time_emits(stdlib, calls) for _ in range(3))
    print(
        f"log emit: JobsightHandler {ours * 1e6:.2f} µs/call, QueueHandler {theirs * 1e6:.2f} µs/call, "
        f"ratio {ours / theirs:.2f}x"
    )
    shipper.flush(60)
    shipper.shutdown(5)


def bench_shipper(settings: AgentSettings, records: int) -> None:
    shipper = Shipper(settings)
    job = f"bench-{os.getpid()}-{now_us()}"
    shipper.enqueue(gpu_record(job, 0))
    shipper.flush(30)  # connection and partitions warmed up
    start = time.perf_counter()
    for i in range(records):
        shipper.enqueue(gpu_record(job, i))
    enqueued = time.perf_counter() - start
    done = shipper.flush(300)
    elapsed = time.perf_counter() - start
    stats = shipper.stats()
    shipper.shutdown(5)
    print(
        f"shipper: {records} gpu_sample records in {elapsed:.2f} s = {records / elapsed:,.0f} records/s "
        f"(enqueue {enqueued / records * 1e6:.2f} µs/record; flushed={done}; "
        f"batches={stats['sent_batches']}, dropped={stats['dropped_records']})"
    )


def bench_nvml(ticks: int, work: Path, settings: AgentSettings) -> None:
    spec = importlib.util.spec_from_file_location("fake_nvml_build", REPO / "tests" / "fake_nvml" / "build.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    try:
        library = build.build_fake_nvml()
    except Exception as exc:  # noqa: BLE001 - a benchmark reports and goes on
        print(f"nvml: fake library unavailable ({exc}); skipped")
        return
    from jobsight.agent.node.daemon import NodeDaemon
    from jobsight.agent.node.nvml import NvmlSampler
    from jobsight.agent.node.registrations import Registration, write_registration

    os.environ["FAKE_NVML_SCENARIO"] = str(REPO / "tests" / "fake_nvml" / "scenarios" / "four_gpus.json")
    sampler = NvmlSampler(str(library))
    gpus = len(sampler.sample())
    start = time.process_time()
    for _ in range(ticks):
        sampler.sample()
    per = (time.process_time() - start) / (ticks * gpus)
    print(f"nvml: {per * 1e6:.1f} µs CPU per GPU per tick ({gpus} GPUs, {ticks} ticks, fake libnvidia-ml)")

    # The daemon's whole tick: registrations, attribution through /proc, host samples.
    jobs = work / "jobs"
    for index, job in enumerate(("1", "2")):
        write_registration(
            jobs,
            Registration(
                cluster="default", job_id=job, node="bench", started_us=now_us(), gpus=(2 * index, 2 * index + 1)
            ),
        )
    shipper = Shipper(settings, use_spool=False)
    daemon = NodeDaemon(settings, sampler, shipper, registration_dir=str(jobs))
    rounds = max(1, ticks // 10)
    start = time.process_time()
    for _ in range(rounds):
        daemon.tick()
    per_tick = (time.process_time() - start) / rounds
    print(f"daemon: {per_tick * 1e3:.2f} ms CPU per tick ({gpus} GPUs, 2 jobs, /proc scan included)")
    shipper.shutdown(5)
    sampler.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--log-calls", type=int, default=100_000)
    parser.add_argument("--ticks", type=int, default=2000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with running_stack() as stack:
        work = stack.work
        settings = AgentSettings(
            url=stack.url,
            token=stack.token,
            node="bench",
            job_id="bench",
            spool_dir=str(work / "spool"),
            data_dir=str(work / "agent"),
            queue_max=max(100_000, args.records + 10),
        )
        bench_log_handler(settings, args.log_calls)
        bench_shipper(settings, args.records)
        bench_nvml(args.ticks, work, settings)


if __name__ == "__main__":
    main()
