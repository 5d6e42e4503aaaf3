"""N researchers' live job pages on one dashboard process, against one page alone.

    python bench/live_pages.py                      # 20 pages of a 64-GPU job, live 60 s
    python bench/live_pages.py --pages 10 --nodes 2 --live-s 30

It starts its own stack (bench/stack.py: an embedded PostgreSQL and the collector), seeds one running
job (8 GPUs a node, 30 minutes at 1 Hz, as bench/browser_page.py does, and kept running by
bench/live_feed.py: a sample and a step a second through ingest) and serves the dashboard as
``jobsight dashboard`` runs it, with its one pool of ``data.READ_CONNECTIONS`` connections. Then, in
one headless Chromium:

1. **alone**: the job page in one window, ``--loads`` timed loads, each after the query cache expired
   (page time as bench/browser_page.py measures it: every visible chart drawn, nothing running);
2. **together**: ``--pages`` windows (windows, not tabs: a background tab is not drawn) opened at
   once, again after the cache expired; each window's page time from its own navigation to every
   visible chart drawn, polled in turn (so to within one round of polls, printed);
3. **live**: the windows stay open ``--live-s`` seconds, refreshing every ``refresh_s`` as a running
   job's page does; every window is checked each round for an error element or error words.

It prints the page time alone and together (median and slowest, and their ratio to alone) and the
number of error pages seen; an error page is a failure of the dashboard, not a slow figure.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import proc_stat  # noqa: E402
from bench.browser_page import (  # noqa: E402
    CLUSTER,
    PAGE_STATE,
    SERVED_PIDS,
    chromium,
    dashboard,
    seed,
    settle,
    timed_load,
)
from bench.live_feed import live_feed  # noqa: E402
from bench.stack import running_stack  # noqa: E402
from jobsight.dashboard.settings import load_dashboard_settings  # noqa: E402

ERROR_WORDS = ("Traceback", "cannot be read")


def _window_state(driver: Any, window: str) -> tuple[int, int, bool, bool, str]:
    """(visible charts, drawn, running, failed, the page's words) of ``window``."""
    driver.switch_to.window(window)
    charts, drawn, running, failed = driver.execute_script(PAGE_STATE)
    body = str(driver.execute_script("return document.body.innerText"))
    return int(charts), int(drawn), bool(running), bool(failed) or any(w in body for w in ERROR_WORDS), body


def together(driver: Any, windows: list[str], page: str, charts: int,
             timeout: float = 600) -> tuple[list[float], float]:
    """Open ``page`` in every window at once; each window's seconds to finished, and the poll round's."""
    started: dict[str, float] = {}
    for window in windows:
        driver.switch_to.window(window)
        started[window] = time.perf_counter()
        driver.execute_script("window.location.href = arguments[0]", page)
    done: dict[str, float] = {}
    rounds: list[float] = []
    while len(done) < len(windows):
        began = time.perf_counter()
        for window in windows:
            if window in done:
                continue
            count, drawn, _, failed, body = _window_state(driver, window)
            if failed:
                raise RuntimeError(f"an error page: {body[-2000:]}")
            # Every chart drawn; not "nothing running": a live page's parts rerun on their own, and under
            # load one of them is running at almost any moment.
            if count >= charts and drawn == count:
                done[window] = time.perf_counter() - started[window]
        rounds.append(time.perf_counter() - began)
        if time.perf_counter() - min(started.values()) > timeout:
            raise RuntimeError(f"{len(windows) - len(done)} pages not finished after {timeout:.0f} s")
    return [done[w] for w in windows], statistics.median(rounds)


def live(driver: Any, windows: list[str], seconds: float) -> tuple[int, int]:
    """Poll every window for ``seconds``; (error pages seen, polls made)."""
    errors = polls = 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        for window in windows:
            *_, failed, body = _window_state(driver, window)
            polls += 1
            if failed:
                errors += 1
                print(f"error page in window {windows.index(window)}: {body[-600:]!r}", flush=True)
    return errors, polls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=20, help="live job pages open at once (default 20)")
    parser.add_argument("--nodes", type=int, default=8, help="nodes of the job, 8 GPUs each (default 8: 64 GPUs)")
    parser.add_argument("--loads", type=int, default=3, help="timed loads of the page alone (default 3)")
    parser.add_argument("--live-s", type=float, default=60, help="seconds the pages stay open and live (default 60)")
    args = parser.parse_args()
    settings = load_dashboard_settings()
    print(f"{args.pages} pages; refresh every {settings.refresh_s} s, query cache {settings.cache_ttl_s} s",
          flush=True)
    with running_stack() as stack:
        (job,) = seed(stack, [(args.nodes, 8)])
        # Kept running (a sample and a step a second), as a live page's job is: left as seeded, it was
        # judged hung a few minutes in, and the pages drew a hung job's banner from then on.
        with live_feed(stack, CLUSTER, [job]), dashboard(stack, {}) as url, chromium() as driver:
            driver.set_script_timeout(120)
            page = f"{url}/job?{urlencode({'cluster': CLUSTER, 'job': job.job_id})}"
            charts = settle(driver, page)
            alone = []
            for _ in range(args.loads):
                time.sleep(settings.cache_ttl_s + 1)
                alone.append(timed_load(driver, page, charts))
            windows = [driver.current_window_handle]
            for _ in range(args.pages - 1):
                driver.switch_to.new_window("window")
                windows.append(driver.current_window_handle)
            time.sleep(settings.cache_ttl_s + 1)
            # The server's share: the dashboard's CPU time, apart from the browser's on the same machine.
            pid, began = SERVED_PIDS[url], time.monotonic()
            cpu = proc_stat.read(pid).cpu_s
            times, poll = together(driver, windows, page, charts)
            cpu_together, wall_together = proc_stat.read(pid).cpu_s - cpu, time.monotonic() - began
            cpu = proc_stat.read(pid).cpu_s
            errors, polls = live(driver, windows, args.live_s)
            cpu_live = proc_stat.read(pid).cpu_s - cpu
    one = statistics.median(alone)
    median, slowest = statistics.median(times), max(times)
    print(f"{job.job_id} ({job.gpus} GPUs), {charts} charts: one page alone {one:5.2f} s "
          f"(loads {', '.join(f'{s:.2f}' for s in alone)})", flush=True)
    print(f"{args.pages} pages at once: median {median:5.2f} s ({median / one:4.1f}× alone), slowest {slowest:5.2f} s "
          f"({slowest / one:4.1f}× alone); each to within a poll round of {poll:.2f} s", flush=True)
    print(f"dashboard process CPU: {cpu_together:.0f} s in the {wall_together:.0f} s until all were drawn; "
          f"{cpu_live:.0f} s in {args.live_s:.0f} s live ({cpu_live / args.live_s:.2f} cores for {args.pages} "
          f"live pages refreshing every {settings.refresh_s} s; the rest of the machine was the browser's)", flush=True)
    print(f"live {args.live_s:.0f} s, {polls} polls of {args.pages} pages: {errors} error page(s)", flush=True)


if __name__ == "__main__":
    main()
