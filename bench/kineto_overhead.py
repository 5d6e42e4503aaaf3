"""Step time of an uninstrumented PyTorch loop with ``KINETO_USE_DAEMON=1`` and no profile request
pending, against the same loop without it (not a test; CI does not run it).

    .venv/bin/python bench/kineto_overhead.py [--pairs 5] [--steps 400]

With the variable set, PyTorch's profiler asks the node daemon for a config every few seconds;
the node daemon's endpoint (agent/node/kineto/endpoint.py, on a socket of the bench's own) answers
"no config", as it does for every job with nothing requested. The loops (a linear model and SGD
on CPU, importing nothing of jobsight) run as fresh processes in alternating pairs, so drifts of a
shared machine fall on both (in ABBA order); each run's median step time is taken, and the median
of the pairs' ratios is printed. Target: at most 1.01.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from jobsight.agent.node.kineto.endpoint import KinetoEndpoint  # noqa: E402

TARGET = 1.01
LOOP = textwrap.dedent("""
    import statistics, sys, time
    import torch
    torch.set_num_threads(1)
    width = int(sys.argv[2])
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(128, width)
    times = []
    for _ in range(int(sys.argv[1])):
        began = time.perf_counter()
        optimizer.zero_grad()
        model(batch).sum().backward()
        optimizer.step()
        times.append(time.perf_counter() - began)
    print(statistics.median(times[20:]))
""")


def run_loop(script: Path, steps: int, width: int, env: dict[str, str]) -> float:
    out = subprocess.run([sys.executable, str(script), str(steps), str(width)], env=env, capture_output=True,
                         text=True, timeout=600, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=12)
    parser.add_argument("--steps", type=int, default=800, help="steps per run (default 800)")
    parser.add_argument("--width", type=int, default=1024,
                        help="hidden width of the model (default 1024: a few ms a step on one CPU thread)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="jsk") as tmp:  # short: Kineto's socket paths are bounded
        work = Path(tmp)
        script = work / "loop.py"
        script.write_text(LOOP)
        polls = 0
        stop = threading.Event()
        endpoint = KinetoEndpoint("dynolog", str(work))

        def serve() -> None:
            nonlocal polls
            while not stop.is_set():
                if endpoint.serve_once(0.2, lambda request, creds: None) is not None:
                    polls += 1

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        base = {k: v for k, v in os.environ.items() if not k.startswith("KINETO_")}
        with_daemon = {**base, "KINETO_USE_DAEMON": "1", "KINETO_IPC_SOCKET_DIR": str(work)}
        plain: list[float] = []
        daemon: list[float] = []
        run_loop(script, 50, args.width, base)  # warm the page cache
        for pair in range(args.pairs):
            # ABBA: each pair runs in the other order, so a machine that drifts favours neither.
            if pair % 2 == 0:
                plain.append(run_loop(script, args.steps, args.width, base))
                daemon.append(run_loop(script, args.steps, args.width, with_daemon))
            else:
                daemon.append(run_loop(script, args.steps, args.width, with_daemon))
                plain.append(run_loop(script, args.steps, args.width, base))
        stop.set()
        server.join(2)
        endpoint.close()
    print("runs without (ms):", " ".join(f"{t * 1e3:.3f}" for t in plain))
    print("runs with    (ms):", " ".join(f"{t * 1e3:.3f}" for t in daemon))
    # The median of the pairs' ratios: runs next to each other in time share the machine's state.
    ratio = statistics.median(d / p for d, p in zip(daemon, plain, strict=True))
    print(f"median step time, {args.pairs} runs of {args.steps} steps each (width {args.width}): without "
          f"{statistics.median(plain) * 1e3:.3f} ms, with KINETO_USE_DAEMON=1 and no request "
          f"{statistics.median(daemon) * 1e3:.3f} ms "
          f"({polls} polls answered)")
    added_us = (statistics.median(daemon) - statistics.median(plain)) * 1e6
    print(f"ratio with / without: {ratio:.4f} (target <= {TARGET}) {'ok' if ratio <= TARGET else 'OVER'}; "
          f"{added_us:+.1f} us a step (Kineto's optimizer-step hook and its polling thread)")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
