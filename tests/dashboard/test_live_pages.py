"""A site's researchers on one dashboard process: 20 live job pages open at once, each refreshing, in
headless Chromium windows, and no page ever shows an error (bench/live_pages.py times the same)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from jobsight.collector.store.embedded_db import free_port
from jobsight.commands.dashboard import streamlit_argv, streamlit_env
from tests.conftest import REPO
from tests.dashboard.seed import Seed
from tests.dashboard.test_browser import headless_chromium
from tests.dashboard.test_unreadable_database import _wait_for_health

pytestmark = pytest.mark.browser

PAGES = 20
REFRESH_S = 3
"""Faster than the default 10 s, the query cache's TTL shorter still: more reads at once than a site's."""
LIVE_S = 20
ERRORS = ("Traceback", "cannot be read", "Error", "error:")
# One round trip a window: whether it has drawn the job, and any error element or words.
STATE = """
const charts = [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')];
const drawn = charts.filter(c => c.querySelector('canvas, svg.marks')).length;
const failed = document.querySelectorAll('[data-testid="stException"], [data-testid="stAlertContentError"]').length;
return [drawn, failed, document.body.innerText];
"""


@pytest.fixture
def live_dashboard(seeded: Seed, database_url: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    port, log = free_port(), tmp_path / "dashboard.log"
    env = streamlit_env({**os.environ, "JOBSIGHT_DATABASE_URL": database_url, "JOBSIGHT_DASHBOARD_AUTH_MODE": "local",
                         "JOBSIGHT_DASHBOARD_CLUSTER": seeded.cluster,
                         "JOBSIGHT_DASHBOARD_REFRESH_S": str(REFRESH_S), "JOBSIGHT_DASHBOARD_CACHE_TTL_S": "1"})
    with open(log, "ab") as out:
        process = subprocess.Popen(streamlit_argv("127.0.0.1", port), env=env, cwd=REPO, stdout=out,
                                   stderr=subprocess.STDOUT)
    try:
        _wait_for_health(port, process, log)
        yield f"http://127.0.0.1:{port}", log
    finally:
        process.terminate()
        process.wait(timeout=30)


def _state(driver: Any, window: str) -> tuple[int, int, str]:
    driver.switch_to.window(window)
    drawn, failed, body = driver.execute_script(STATE)
    return int(drawn), int(failed), str(body)


def _problem(failed: int, body: str) -> str | None:
    """What is wrong with a window's page, ``None`` when nothing is."""
    if failed:
        return f"{failed} error element(s): {body[-1500:]}"
    said = [word for word in ERRORS if word in body]
    return f"says {said}: {body[-1500:]}" if said else None


# Twenty Chromium windows drawing at once on two cores take minutes; their own deadline below (300 s)
# is what the test judges by, so the run as a whole gets more than pytest's default.
@pytest.mark.timeout(600)
def test_twenty_live_job_pages_at_once_show_no_error(seeded: Seed, live_dashboard: tuple[str, Path]) -> None:
    url, log = live_dashboard
    # The page as a researcher opens it: the heatmap, steps and throughput, three charts a page.
    page = f"{url}/job?{urlencode({'cluster': seeded.cluster, 'job': seeded.running})}"
    browser = headless_chromium(1400)
    driver = next(browser)
    try:
        driver.set_script_timeout(60)
        windows = [driver.current_window_handle]
        for _ in range(PAGES - 1):
            driver.switch_to.new_window("window")  # windows, not tabs: a background tab is not drawn
            windows.append(driver.current_window_handle)
        for window in windows:  # all opened at once, as a lab's researchers do after a meeting
            driver.switch_to.window(window)
            driver.execute_script("window.location.href = arguments[0]", page)
        pending, deadline = set(windows), time.monotonic() + 300
        while pending:
            for window in sorted(pending):
                drawn, failed, body = _state(driver, window)
                assert (problem := _problem(failed, body)) is None, problem
                if drawn >= 3 and f"Job {seeded.running}" in body:
                    pending.discard(window)
            assert time.monotonic() < deadline, f"{len(pending)} of {PAGES} pages not drawn: {log.read_text()[-3000:]}"
        # Live: every page refreshes on its own; none may fail meanwhile.
        live_until = time.monotonic() + LIVE_S
        while time.monotonic() < live_until:
            for window in windows:
                drawn, failed, body = _state(driver, window)
                assert (problem := _problem(failed, body)) is None, problem
                assert f"Job {seeded.running}" in body
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
    finally:
        next(browser, None)
