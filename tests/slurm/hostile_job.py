"""A job an ordinary user submits to fool jobsight (tests/slurm/test_hostile_jobs.py): with the job
token its task prolog handed it, it sends

* a harmless log line of its own job under the sources the root hooks will use for the *next* job
  (``{cluster}/{node}:slurm-prolog:{next}.0`` and ``…slurm-epilog…``, seq 0), to make that job's
  registration and end "duplicates";
* a ``gpu_sample`` of its own GPU at 95.25 % (the fake NVML never reports that), to hide that its
  GPU idles.

It prints what the collector answered as ``KEY=value`` lines, sleeps so that the node daemon
samples its GPU, and exits 0. Standard library only, as a user's own code would be."""

from __future__ import annotations

import gzip
import json
import os
import socket
import time
import urllib.error
import urllib.request

FORGED_UTIL = 95.25


def post(url: str, token: str, cluster: str, source: str, seq: int, records: list[dict[str, object]]) -> str:
    body = {"v": 1, "source": source, "seq": seq, "cluster": cluster, "sent_at": time.time(), "records": records}
    request = urllib.request.Request(url + "/v1/ingest", data=gzip.compress(json.dumps(body).encode()), headers={
        "Authorization": f"Bearer {token}", "Content-Encoding": "gzip", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return f"{answer.status}:{json.loads(answer.read())['status']}"
    except urllib.error.HTTPError as exc:
        return str(exc.code)


def main() -> None:
    url, token, job = os.environ["JOBSIGHT_URL"], os.environ["JOBSIGHT_TOKEN"], os.environ["JOBSIGHT_JOB_ID"]
    cluster = os.environ.get("JOBSIGHT_CLUSTER", "default")
    node = socket.gethostname().split(".")[0]
    victim = int(os.environ["SLURM_JOB_ID"]) + 1
    now = time.time_ns() // 1000
    for hook in ("prolog", "epilog"):
        source = f"{cluster}/{node}:slurm-{hook}:{victim}.0"
        line = {"kind": "log", "job": job, "ts": now, "node": node, "level": "INFO", "message": "just a log line"}
        print(f"LEDGER_{hook.upper()}={post(url, token, cluster, source, 0, [line])}")
    gpu = int(os.environ.get("SLURM_JOB_GPUS", "0").split(",")[0])
    samples = [{"kind": "gpu_sample", "job": job, "ts": now + i * 500_000, "node": node, "gpu_index": gpu,
                "gpu_uuid": f"GPU-forged-{gpu}", "util_gpu": FORGED_UTIL} for i in range(4)]
    print(f"FORGED_SAMPLES={post(url, token, cluster, f'forger-{job}', 1, samples)}")
    print(f"SLURM_JOB_ID={os.environ['SLURM_JOB_ID']}")
    print(f"JOBSIGHT_TOKEN={token}")
    time.sleep(4)


if __name__ == "__main__":
    main()
