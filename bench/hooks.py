"""Wall time of the Slurm hooks, as a job sees it (not a test; CI does not run it).

    .venv/bin/python bench/hooks.py [--runs 15]

Runs ``jobsight slurm prolog`` and ``jobsight slurm epilog`` as fresh processes (what
the ``slurm/`` wrappers do; interpreter start-up included) with a Slurm-like
environment, first against a live collector (its own embedded PostgreSQL, migrated,
with a cluster secret), then with the collector stopped (the hooks spool), and prints
the median and worst wall time of each. Target: under 300 ms each, both ways.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from collector import migrate  # noqa: E402
from collector.embedded_db import EmbeddedPostgres, free_port  # noqa: E402

TARGET_MS = 300.0


def hook_command() -> list[str]:
    script = Path(sys.executable).parent / "jobsight"
    return [str(script)] if os.access(script, os.X_OK) else [sys.executable, "-m", "agent.cli"]


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


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit("the collector exited during start-up")
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    raise SystemExit("the collector was not ready in time")


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
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="jobsight-bench-hooks-"))
    database = EmbeddedPostgres(work / "postgres")
    collector: subprocess.Popen[bytes] | None = None
    try:
        url_db = database.start()
        migrate.upgrade(url_db)
        secret = work / "cluster_secret"
        secret.write_text(os.urandom(32).hex() + "\n")
        secret.chmod(0o600)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        collector = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "collector"], cwd=REPO, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "JOBSIGHT_DATABASE_URL": url_db, "JOBSIGHT_DATA_DIR": str(work / "data"),
                 "JOBSIGHT_PORT": str(port), "JOBSIGHT_SECRET_FILE": str(secret)})
        wait_ready(url, collector)
        base = {
            "JOBSIGHT_URL": url, "JOBSIGHT_SECRET_FILE": str(secret), "JOBSIGHT_TOKEN_DIR": str(work / "tokens"),
            "JOBSIGHT_REGISTRATION_DIR": str(work / "jobs"), "JOBSIGHT_SPOOL_DIR": str(work / "spool"),
            "JOBSIGHT_HOOK_LOG": str(work / "hooks.log"), "JOBSIGHT_SCONTROL": "/nonexistent",
        }
        print(f"jobsight Slurm hooks, wall time per call ({' '.join(hook_command())} slurm HOOK)")
        time_hooks(base, 2, 1)  # warm the page cache and the collector's pool
        ok = report("collector up", time_hooks(base, args.runs, 100))
        collector.terminate()
        collector.wait(timeout=30)
        collector = None
        ok &= report("collector down", time_hooks(base, args.runs, 1000))
        spooled = len(list((work / "spool").glob("*.seg")))
        print(f"  (collector down: {spooled} batches spooled for the node daemon to replay)")
        print(f"target: median under {TARGET_MS:.0f} ms each: {'met' if ok else 'NOT met'}")
        return 0
    finally:
        if collector is not None:
            collector.kill()
        database.destroy()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
