"""`jobsight up --demo` as a new user first sees it, in headless Chromium.

The real command on free ports with a temporary data dir, the simulated job's story shortened by its
settings (it has run 55 s when the cluster starts, hangs 5 s later) and the hung-rank rule's
thresholds shortened by the collector's. Checked: one console line per component and none of the
components' own output; the collector opens a hung-rank finding and the demo sink gets its alert;
the simulated job's page shows the heatmap of its 16 GPUs and the open finding; the audit page
(local mode: admin) has the history's jobs; no page offers Streamlit's "Deploy".

Screenshots, page sources and the browser console go to the test's tmp dir and to
``/tmp/demo-shots/``.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from tests.collector.test_up import Up
from tests.dashboard.test_browser import _wait, headless_chromium

pytestmark = pytest.mark.browser

SHOTS = Path("/tmp/demo-shots")
DEMO_ENV = {
    # The simulated job: launched 25 s after its start, healthy until 20 s, rank 11 straggling until
    # 60 s, then hung until its 30-minute limit. Its first 55 s are written when the cluster starts.
    "JOBSIGHT_DEMO_HEALTHY_S": "20",
    "JOBSIGHT_DEMO_STRAGGLER_S": "40",
    "JOBSIGHT_DEMO_HEADSTART_S": "55",
    "JOBSIGHT_DEMO_TIME_LIMIT_S": "1800",
    # The real CPU job: half a minute, so that the machine's cores serve the rest afterwards.
    "JOBSIGHT_DEMO_MINUTES": "0.5",
    # The collector: evaluate every 3 s; a rank is hung after 15 s without a step (10× its 0.6 s step is less).
    "JOBSIGHT_HEALTH_INTERVAL_S": "3",
    "JOBSIGHT_HEALTH_HUNG_MIN_S": "15",
    "JOBSIGHT_ALERTS_GROUP_WINDOW_S": "5",
}
HEATMAP_AXIS = """
return [...document.querySelectorAll('[data-testid="stVegaLiteChart"] [aria-label]')]
    .map(e => e.getAttribute('aria-label')).filter(l => l.startsWith('Y-axis for a discrete scale'));
"""
HUNG_ON_PAGE = re.compile(r"looks hung|has stopped stepping", re.IGNORECASE)


@pytest.fixture
def chromium() -> Iterator[Any]:
    """Headless Chromium as tests/dashboard/test_browser.py drives it, with a taller window for the shots."""
    yield from headless_chromium(3000)


def _get(url: str, token: str) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _open_findings(up: Up, job: str) -> list[dict[str, Any]]:
    try:
        found = _get(f"{up.url}/v1/jobs/{job}/findings?{urlencode({'cluster': 'simulated'})}", up.token)
    except (urllib.error.URLError, OSError):
        return []
    return [f for f in found["findings"] if f["state"] == "open"]


def _body(driver: Any) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.TAG_NAME, "body").text)


def _keep(driver: Any, out: Path, name: str) -> list[dict[str, Any]]:
    """Screenshot, page source and console of the page now, in ``out`` and in :data:`SHOTS`;
    returns the console's entries since the last call."""
    driver.save_screenshot(str(out / f"{name}.png"))
    (out / f"{name}.html").write_text(driver.page_source)
    console: list[dict[str, Any]] = driver.get_log("browser")
    (out / f"{name}.console.log").write_text("\n".join(str(entry) for entry in console))
    SHOTS.mkdir(parents=True, exist_ok=True)
    for suffix in (".png", ".console.log"):
        shutil.copy(out / f"{name}{suffix}", SHOTS / f"{name}{suffix}")
    return console


def _chart_errors(console: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Errors Vega logged drawing a chart (a blank trend chart, a NaN axis)."""
    return [e for e in console if e.get("level") == "SEVERE" and ("vega" in str(e).lower() or "embed." in str(e))]


def _no_deploy(driver: Any) -> None:
    from selenium.webdriver.common.by import By

    assert not driver.find_elements(By.CSS_SELECTOR, '[data-testid="stAppDeployButton"]')
    assert not driver.find_elements(By.CSS_SELECTOR, '[data-testid="stMainMenu"]')
    assert "Deploy" not in _body(driver)


def _settled(driver: Any) -> bool:
    from selenium.webdriver.common.by import By

    running = driver.find_elements(By.CSS_SELECTOR,
                                   '[data-testid="stStatusWidget"] [data-testid="stStatusWidgetRunningIcon"]')
    return not running and bool(driver.find_elements(By.CSS_SELECTOR, '[data-testid="stHeading"]'))


def test_demo_first_look(chromium: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    driver = chromium
    up = Up(tmp_path / "data", tmp_path / "up.log", env=DEMO_ENV)
    up.args = ["--demo"]
    with up:
        console = (tmp_path / "up.log").read_text()
        # One line per component, with its URL; the components' own output went to their log files.
        for label in ("collector", "dashboard", "demo job", "simulated", "history", "alerts", "data"):
            assert re.search(rf"^  {label} +\S", console, re.MULTILINE), console
        for noise in ("Running upgrade", "Uvicorn running", "You can now view your Streamlit app", "GPU available"):
            assert noise not in console, console
        simulated = re.search(r"simulated +(http\S+job=(sim-\d+))", console)
        assert simulated is not None, console
        job_url, job = simulated.group(1), simulated.group(2)
        assert (tmp_path / "data" / "logs" / "collector.log").stat().st_size > 0

        # The collector opens the hung-rank finding, and the demo sink is told.
        _wait(lambda: any(f["rule"] == "hung_rank" for f in _open_findings(up, job)), 180, "a hung-rank finding")
        alerts = tmp_path / "data" / "logs" / "demo-alerts.log"
        _wait(lambda: alerts.exists() and "hung" in alerts.read_text().lower(), 60, "the hang's alert at the demo sink")
        assert "alert: " in (tmp_path / "up.log").read_text()

        # The simulated job's page: 16 GPU rows in the heatmap, the open finding on the page.
        driver.get(job_url)
        try:
            _wait(lambda: any("with 16 values: sim-gpu01:0" in label for label in driver.execute_script(HEATMAP_AXIS)),
                  120, "the heatmap of the 16 GPUs")
            _wait(lambda: HUNG_ON_PAGE.search(_body(driver)) is not None, 60, "the hung-rank finding on the job page")
            _wait(lambda: _settled(driver), 60, "the job page's script run to finish")
            time.sleep(1.0)
        finally:
            console = _keep(driver, tmp_path, "demo-job-page")
        assert not _chart_errors(console), console
        body = _body(driver)
        assert not driver.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]'), body[:2000]
        assert "simulated: " in body and "sim-gpu02" in body
        _no_deploy(driver)

        # The audit (local mode is an admin): the history's jobs in the default period, the last 7 days.
        driver.get(f"http://127.0.0.1:{up.dashboard_port}/audit")
        try:
            _wait(lambda: len(driver.find_elements(By.CSS_SELECTOR, '[data-testid="stMetricValue"]')) >= 4
                  and len(driver.find_elements(By.CSS_SELECTOR, '[data-testid="stDataFrame"]')) >= 3, 90,
                  "the audit's figures and tables")
            _wait(lambda: _settled(driver), 60, "the audit page's script run to finish")
            time.sleep(1.0)
        finally:
            console = _keep(driver, tmp_path, "demo-audit-page")
        assert not _chart_errors(console), console
        figures = {m.find_element(By.CSS_SELECTOR, '[data-testid="stMetricLabel"]').text.strip():
                   m.find_element(By.CSS_SELECTOR, '[data-testid="stMetricValue"]').text.strip()
                   for m in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stMetric"]')}
        assert int(figures["Jobs"]) >= 5 and float(figures["GPU-hours"].lstrip("≥ ").replace(",", "")) > 0, figures
        assert "No GPU-hours in this period." not in _body(driver)
        _no_deploy(driver)

        driver.get(f"http://127.0.0.1:{up.dashboard_port}/")  # the jobs list is the default page
        try:
            _wait(lambda: driver.find_elements(By.CSS_SELECTOR, '[data-testid="stDataFrame"]'), 60, "the jobs list")
            _wait(lambda: _settled(driver), 60, "the jobs page's script run to finish")
        finally:
            console = _keep(driver, tmp_path, "demo-jobs-page")
        assert not _chart_errors(console), console
        _no_deploy(driver)
        assert up.interrupt() == 0
    assert "stopping jobsight" in (tmp_path / "up.log").read_text()
