"""The job page of a seeded job, served by `jobsight up`, in headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from jobsight.dashboard import page_paths
from tests.collector.test_up import Up
from tests.conftest import REPO
from tests.dashboard.seed import Seed

pytestmark = pytest.mark.browser

OUTPUT = REPO / "test-output" / "dashboard"
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def headless_chromium(window_height: int) -> Iterator[Any]:
    """Debian's chromium driven headless through chromedriver (skips without them, fails with
    ``JOBSIGHT_REQUIRE_BROWSER=1``, as CI sets), 1600 pixels wide."""
    if not (CHROMIUM and CHROMEDRIVER):
        reason = "needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)"
        if os.environ.get("JOBSIGHT_REQUIRE_BROWSER") == "1":
            pytest.fail(f"JOBSIGHT_REQUIRE_BROWSER=1 but the test {reason}")
        pytest.skip(reason)
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="jobsight-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 f"--user-data-dir={profile}", f"--window-size=1600,{window_height}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def browser() -> Iterator[Any]:
    yield from headless_chromium(2400)


def _wait(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_job_page_renders_charts_without_exceptions(browser: object, seeded: Seed, database_url: str,
                                                   tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    OUTPUT.mkdir(parents=True, exist_ok=True)
    # `jobsight up` on loopback: the local (admin) mode `make up` uses, over the seeded database.
    with Up(tmp_path / "data", tmp_path / "up.log", env={"JOBSIGHT_DATABASE_URL": database_url,
                                                         "JOBSIGHT_DASHBOARD_CLUSTER": seeded.cluster}) as up:
        query = urlencode({"cluster": seeded.cluster, "job": seeded.running, "details": "metrics"})
        url = f"http://127.0.0.1:{up.dashboard_port}/job?{query}"
        driver.get(url)  # type: ignore[attr-defined]

        def charts_drawn() -> bool:
            drawn = driver.find_elements(  # type: ignore[attr-defined]
                By.CSS_SELECTOR, '[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg.marks')
            return len(drawn) >= 5  # heatmap, steps, throughput, loss and lr

        try:
            _wait(charts_drawn, 90, "the job page's charts")
            _wait(lambda: not driver.find_elements(  # type: ignore[attr-defined]
                By.CSS_SELECTOR, '[data-testid="stStatusWidget"] [data-testid="stStatusWidgetRunningIcon"]'),
                30, "the script run to finish")
            time.sleep(1.0)
        finally:
            driver.save_screenshot(str(OUTPUT / "job_page.png"))  # type: ignore[attr-defined]
            (OUTPUT / "job_page.html").write_text(driver.page_source)  # type: ignore[attr-defined]
            console = driver.get_log("browser")  # type: ignore[attr-defined]
            (OUTPUT / "console.log").write_text("\n".join(str(entry) for entry in console))
        body = driver.find_element(By.TAG_NAME, "body").text  # type: ignore[attr-defined]
        assert not driver.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]'), body[:2000]  # type: ignore[attr-defined]
        assert f"Job {seeded.running}" in body and "llm-pretrain" in body
        assert "Straggler rank(s): 1" in body
        assert (OUTPUT / "job_page.png").stat().st_size > 10_000
        assert not [e for e in console if e.get("level") == "SEVERE" and "vega" in str(e).lower()], console
        # The page named its server (jobsight.dashboard.page_paths): the browser asked the server's health at
        # the root alone, not first at /job/, a wrong guess Streamlit retries after a tenth of a second.
        health_checks = driver.execute_script(  # type: ignore[attr-defined]
            "return performance.getEntriesByType('resource').map(e => new URL(e.name).pathname)"
            ".filter(p => p.endsWith('/_stcore/health'))")
        assert health_checks == ["/_stcore/health"], health_checks
        # The page loads Streamlit's chart code early (page_paths.chart_code_script), from the address
        # Streamlit's bundle imports it from: the browser fetched it once.
        chart_code = driver.execute_script(  # type: ignore[attr-defined]
            "return performance.getEntriesByType('resource').map(e => new URL(e.name).pathname)"
            ".filter(p => p.includes('/ArrowVegaLiteChart.'))")
        assert chart_code == [f"/static/js/{page_paths.chart_code()}"], chart_code
        # The heatmap is one picture (jobsight.dashboard.heatmap_picture); each GPU's row still answers the
        # pointer, through an invisible row over it, with the GPU's mean and its lowest bucket.
        from selenium.webdriver.common.action_chains import ActionChains

        heatmap = driver.find_element(By.CSS_SELECTOR, '[data-testid="stVegaLiteChart"]')  # type: ignore[attr-defined]
        plot = heatmap.find_element(By.CSS_SELECTOR, "svg.marks, canvas")
        ActionChains(driver).move_to_element(plot).perform()  # type: ignore[arg-type]
        tip = driver.execute_script(  # type: ignore[attr-defined]
            "const t = document.getElementById('vg-tooltip-element');"
            "return t && t.classList.contains('visible') ? t.innerText : null")
        assert tip is not None and re.fullmatch(r"\S+:\d+ · mean \d+ % · lowest \d+ % at [-\d]+ [:\d]+ UTC", tip), tip
        assert up.interrupt() == 0
