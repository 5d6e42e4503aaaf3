"""Wall time of the Slurm hooks, as a job sees it (not a test; CI does not run it).

    .venv/bin/python bench/hooks.py [--runs 15]

Runs ``jobsight slurm prolog`` and ``jobsight slurm epilog`` as fresh processes (what
the ``slurm/`` wrappers do; interpreter start-up included) with a Slurm-like
environment, first against a live collector (its own embedded PostgreSQL, migrated,
with a cluster secret), then with the collector stopped (the hooks spool), and prints
the median and worst wall time of each. Target: under 300 ms each, both ways.

Both hooks call ``squeue --json -j`` (the prolog for the time limit and name, the epilog for
the end state): the real ``/usr/bin/squeue`` where it is installed (a round trip to slurmctld when
one runs), else a stub script that prints a line as Slurm 22.05 does, so that the call's process
start is counted either way. ``--squeue PATH`` picks another.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.stack import running_stack  # noqa: E402

TARGET_MS = 300.0
REAL_SQUEUE = "/usr/bin/squeue"


def stub_squeue(work: Path) -> str:
    """What squeue --json says during a real epilog (a time limit kill), for any job asked about."""
    from tests.slurm.squeue_stub import squeue_stub, wait_status

    return squeue_stub(work, {"name": "bench", "job_state": "COMPLETING", "state_reason": "TimeLimit",
                              "exit_code": wait_status(0, 15), "time_limit": 1})


def hook_command() -> list[str]:
    script = Path(sys.executable).parent / "jobsight"
    return [str(script)] if os.access(script, os.X_OK) else [sys.executable, "-m", "jobsight"]


def slurm_env(base: dict[str, str], job: int, hook: str) -> dict[str, str]:
    return {
        **base, "SLURM_JOB_ID": str(job), "SLURMD_NODENAME": "bench", "SLURM_JOB_USER": "nobody",
        "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_GID": str(os.getgid()), "SLURM_JOB_PARTITION": "gpu",
        "SLURM_JOB_NUM_NODES": "1", "SLURM_NODELIST": "bench", "SLURM_JOB_GPUS": "0,1",
        "SLURM_SCRIPT_CONTEXT": f"{hook}_slurmd", "SLURM_JOB_EXIT_CODE2": "0:0",
    }


def time_hooks(base: dict[str, str], runs: int, first_job: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"prolog": [], "epilog": []}
    for job in range(first_job, first_job + runs):
        for hook in ("prolog", "epilog"):
            started = time.perf_counter()
            result = subprocess.run([*hook_command(), "slurm", hook], env=slurm_env(base, job, hook),
                                    stdin=subprocess.DEVNULL, capture_output=True, cwd="/")
            times[hook].append((time.perf_counter() - started) * 1000)
            if result.returncode != 0:
                raise SystemExit(f"{hook} exited {result.returncode}: {result.stderr.decode()[-500:]}")
    return times


def report(label: str, times: dict[str, list[float]]) -> bool:
    ok = True
    for hook, values in times.items():
        median = statistics.median(values)
        ok &= median < TARGET_MS
        print(f"  {hook:<7} {label:<15} median {median:6.1f} ms   max {max(values):6.1f} ms   "
              f"({len(values)} runs)  {'ok' if median < TARGET_MS else 'OVER TARGET'}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--squeue", help=f"the squeue the hooks call (default: {REAL_SQUEUE} if present, "
                        "else a stub)")
    args = parser.parse_args()
    with running_stack() as stack:
        work = stack.work
        base = {
            "JOBSIGHT_URL": stack.url, "JOBSIGHT_SECRET_FILE": str(stack.secret_file),
            "JOBSIGHT_TOKEN_DIR": str(work / "tokens"), "JOBSIGHT_REGISTRATION_DIR": str(work / "jobs"),
            "JOBSIGHT_SPOOL_DIR": str(work / "spool"), "JOBSIGHT_HOOK_LOG": str(work / "hooks.log"),
        }
        squeue = args.squeue or (REAL_SQUEUE if os.access(REAL_SQUEUE, os.X_OK) else stub_squeue(work))
        base["JOBSIGHT_SQUEUE"] = squeue
        print(f"jobsight Slurm hooks, wall time per call ({' '.join(hook_command())} slurm HOOK), "
              f"squeue --json by {squeue}")
        time_hooks(base, 2, 1)  # warm the page cache and the collector's pool
        ok = report("collector up", time_hooks(base, args.runs, 100))
        stack.stop_collector()
        ok &= report("collector down", time_hooks(base, args.runs, 1000))
        spooled = len(list((work / "spool").glob("*.seg")))
        print(f"  (collector down: {spooled} batches spooled for the node daemon to replay)")
        print(f"target: median under {TARGET_MS:.0f} ms each: {'met' if ok else 'NOT met'}")
        return 0

if __name__ == "__main__":
    sys.exit(main())
