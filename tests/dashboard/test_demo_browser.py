"""`jobsight up --demo` as a new user first sees it, in headless Chromium.

The real command on free ports with a temporary data dir, the simulated job's story shortened by its
settings (it has run 55 s when the cluster starts, hangs 5 s later) and the hung-rank rule's
thresholds shortened by the collector's. Checked: one console line per component and none of the
components' own output; the collector opens a hung-rank finding and the demo sink gets its alert;
the simulated job's page shows the heatmap of its 16 GPUs and the open finding; the audit page
(local mode: admin) has the history's jobs; no page offers Streamlit's "Deploy".

At 30 minutes (:func:`test_demo_at_thirty_minutes`, the story's settings set so that rank 11 straggles over
the whole default window): the job page's heatmap at the 1 s sampling interval (its caption, and the drawn
row's colour changes), rank 11's red own-work line clear of the band in the chart's pixels, and on the job,
jobs, audit and actions pages (each tab open in turn) no element cut (sizes against text, SVG text against
its drawing, data frames' cells against their column lines in the grid's pixels, no frame scrolling
sideways at 1600 px), no "None", "nan", traceback or exception box, in the text or in any frame's cells.

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

from jobsight.dashboard import job_details
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


# -- at 30 minutes: the recent window at full resolution, the straggler apart, nothing cut, no raw None --------------

DEMO_30_ENV = {
    # The simulated job has run 30 minutes when the cluster starts (its past written at once): healthy for
    # 10, rank 11 straggling from then until 35 minutes, so over the whole default "last 15 min" window.
    "JOBSIGHT_DEMO_HEALTHY_S": "600",
    "JOBSIGHT_DEMO_STRAGGLER_S": "1500",
    "JOBSIGHT_DEMO_HEADSTART_S": "1800",
    "JOBSIGHT_DEMO_TIME_LIMIT_S": "3600",
    "JOBSIGHT_DEMO_MINUTES": "0.5",
}
SAMPLED_1S = "GPUs sampled every 1 s; each cell and point is a 1 s bucket"
COARSE_CELLS = 125
"""The columns a coarse bucketing of the window would draw (the cell budget the issue saw at 24 minutes):
a heatmap row at the sampling interval changes colour many times more often than this."""
STRAGGLER_RED, BAND_BLUE, MEDIAN_BLUE = (0xE4, 0x57, 0x56), (0x9E, 0xCA, 0xE9), (0x31, 0x82, 0xBD)
BAND_ON_WHITE = tuple(round(255 - 0.35 * (255 - c)) for c in BAND_BLUE)
"""The band as drawn: #9ecae9 at opacity 0.35 over the white plot."""
CHART_BESIDE_CAPTION = """
const caption = [...document.querySelectorAll('[data-testid="stCaptionContainer"]')]
    .find(c => c.innerText.startsWith(arguments[0]));
let box = caption && caption.closest('[data-testid="stElementContainer"]');
while (box && !(box.querySelector && box.querySelector('[data-testid="stVegaLiteChart"]')))
    box = box.previousElementSibling;
return box ? box.querySelector('[data-testid="stVegaLiteChart"]') : null;
"""
CHART_TITLED = """
return [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')]
    .find(c => c.textContent.includes(arguments[0])) || null;
"""
CLIPPED = """
const main = document.querySelector('[data-testid="stMain"]') || document.body;
const hides = (o) => o === 'hidden' || o === 'clip';
const hidden = (e, top) => {
  for (; e && e !== top; e = e.parentElement) {
    const style = getComputedStyle(e);
    if (e.getAttribute('opacity') === '0' || style.opacity === '0' || style.display === 'none') return true;
  }
  return false;
};
const found = [];
for (const e of main.querySelectorAll('*')) {
  if (e.closest('[data-testid="stDataFrame"], [data-testid="stVegaLiteChart"], svg')) continue;
  const r = e.getBoundingClientRect();
  const text = (e.innerText || '').trim();
  if (r.width === 0 || r.height === 0 || !text) continue;
  const s = getComputedStyle(e);
  const wide = e.scrollWidth > e.clientWidth + 1 && (hides(s.overflowX) || s.textOverflow === 'ellipsis');
  const tall = e.scrollHeight > e.clientHeight + 1 && hides(s.overflowY);
  if (wide || tall) {
    const holder = e.closest('[data-testid]');
    found.push(`${holder ? holder.dataset.testid : e.tagName} "${text.slice(0, 80)}": `
               + `${e.clientWidth}x${e.clientHeight} shown of ${e.scrollWidth}x${e.scrollHeight}`);
  }
}
for (const m of main.querySelectorAll('[data-testid="stMetricValue"]')) {
  const range = document.createRange(); range.selectNodeContents(m);
  const inked = range.getBoundingClientRect(), box = m.getBoundingClientRect();
  if (inked.right > box.right + 1 || inked.left < box.left - 1)
    found.push(`stMetricValue "${m.innerText.trim()}": its text ${inked.width.toFixed(0)} px wide `
               + `in ${box.width.toFixed(0)} px`);
}
for (const c of main.querySelectorAll('[data-testid="stVegaLiteChart"]')) {
  const box = c.getBoundingClientRect(), drawn = c.querySelector('canvas.marks, svg.marks');
  if (!drawn) continue;
  const title = (c.querySelector('.role-title-text') || {textContent: '(untitled)'}).textContent;
  const d = drawn.getBoundingClientRect();
  if (d.width > box.width + 1 || d.height > box.height + 1)
    found.push(`stVegaLiteChart: drawn ${d.width.toFixed(0)}x${d.height.toFixed(0)} `
               + `in ${box.width.toFixed(0)}x${box.height.toFixed(0)}`);
  // SVG: every title, label and legend entry inside the drawing (a legend taller than the chart is cut);
  // 3 px for the text box around the glyphs (a title at the top, a rotated axis title).
  for (const t of drawn.tagName === 'svg' ? drawn.querySelectorAll('text') : []) {
    const b = t.getBoundingClientRect();
    if (hidden(t, drawn)) continue;  // an axis label Vega hid, as overlapping its neighbour
    if (b.width && (b.left < d.left - 3 || b.right > d.right + 3 || b.top < d.top - 3 || b.bottom > d.bottom + 3))
      found.push(`stVegaLiteChart "${title}": its text "${t.textContent}" outside the drawing `
                 + `(${b.left.toFixed(0)},${b.top.toFixed(0)}-${b.right.toFixed(0)},${b.bottom.toFixed(0)} `
                 + `in ${d.left.toFixed(0)},${d.top.toFixed(0)}-${d.right.toFixed(0)},${d.bottom.toFixed(0)})`);
  }
}
for (const f of main.querySelectorAll('[data-testid="stDataFrame"]')) {
  const scroller = f.querySelector('.dvn-scroller');
  const heads = [...f.querySelectorAll('th')].map(h => h.textContent).join(', ');
  if (scroller && scroller.scrollWidth > scroller.clientWidth + 1)
    found.push(`stDataFrame (${heads}) scrolls sideways: `
               + `${scroller.scrollWidth} px of columns in ${scroller.clientWidth}`);
}
return found;
"""
FRAME_CELLS = """
const scroller = arguments[0].querySelector('.dvn-scroller');
scroller.scrollTop = arguments[1];
const cells = [...arguments[0].querySelectorAll('th, td')].map(c => c.textContent);
return [scroller.scrollHeight, scroller.clientHeight, cells];
"""
RAW = {"None": re.compile(r"\bNone\b"), "nan": re.compile(r"\bnan\b", re.IGNORECASE),
       "a traceback": re.compile(r"Traceback")}


def _frames(driver: Any) -> list[Any]:
    """The data frames drawn now (a frame in a tab not open is not)."""
    from selenium.webdriver.common.by import By

    return [frame for frame in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stDataFrame"]')
            if frame.is_displayed() and frame.find_elements(By.CSS_SELECTOR, ".dvn-scroller")]


def _frame_text(driver: Any, frame: Any) -> list[str]:
    """The text of every cell of ``frame``. Glide's grid draws on a canvas and keeps an accessible table
    of the cells in view (the data's own text: a number unformatted, a missing value empty): the frame
    is scrolled through, a view at a time, and read."""
    cells: list[str] = []
    top = 0
    while True:
        driver.execute_script(FRAME_CELLS, frame, top)
        time.sleep(0.5)  # the grid redraws its accessible table after a scroll
        total, height, seen = driver.execute_script(FRAME_CELLS, frame, top)
        cells += seen
        top += max(int(height * 0.8), 1)
        if height <= 0 or top >= total - height + int(height * 0.8):
            break
    driver.execute_script(FRAME_CELLS, frame, 0)
    return cells


def _raw_words(text: str) -> list[str]:
    return [f"{what} in {match.string[max(0, match.start() - 60):match.end() + 60]!r}"
            for what, pattern in RAW.items() for match in pattern.finditer(text)]


def _view_problems(driver: Any, view: str) -> list[str]:
    """What a reader of the page as it shows now would see wrong: an element cut, a raw None or nan, a
    traceback."""
    from selenium.webdriver.common.by import By

    problems = [f"{view}: clipped {what}" for what in driver.execute_script(CLIPPED)]
    if driver.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]'):
        problems.append(f"{view}: an exception box")
    problems += [f"{view}: {word}" for word in _raw_words(_body(driver))]
    for frame in _frames(driver):
        cells = "\n".join(_frame_text(driver, frame))
        problems += [f"{view}, a data frame's cell: {word}" for word in _raw_words(cells)]
        heads = [h.get_attribute("textContent") for h in frame.find_elements(By.CSS_SELECTOR, "th")]
        grid = frame.find_element(By.CSS_SELECTOR, 'canvas[data-testid="data-grid-canvas"]')
        problems += [f"{view}: a data frame's cells cut, {cut}" for cut in _cut_cells(_shot(grid), heads)]
    return problems


def _page_problems(driver: Any, page: str) -> list[str]:
    """:func:`_view_problems` of ``page`` as it opened and with each of its other tabs open in turn."""
    from selenium.webdriver.common.by import By

    problems = dict.fromkeys(_view_problems(driver, page))
    tabs = '[data-testid="stTabs"] button[role="tab"]'
    for index in range(len(driver.find_elements(By.CSS_SELECTOR, tabs))):
        tab = driver.find_elements(By.CSS_SELECTOR, tabs)[index]  # found again: a tab may rerun the page
        if tab.get_attribute("aria-selected") == "true":
            continue
        name = tab.text.strip()
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", tab)
        tab.click()
        time.sleep(1.0)
        _wait(lambda: _settled(driver), 120, f"{page} with its tab {name!r} open")
        time.sleep(1.5)
        problems.update(dict.fromkeys(_view_problems(driver, f"{page}, tab {name!r}")))
    return list(problems)


GRID_LINE = (232, 229, 226)
"""The colour of the lines between a data frame's columns and rows (Streamlit's light theme)."""
HEADER_PX = 30
"""Within the header row of a data frame, below its top border."""


def _cut_cells(picture: Any, heads: list[str]) -> list[str]:
    """The columns of a data frame's drawing (glide's grid draws its cells on a canvas, so there is no
    element to measure) where a cell's text runs into the line at its edge: the grid clips a text wider
    than its column there, while text that fits keeps a padding of 8 pixels from both lines. Column
    lines are found as pixel columns of :data:`GRID_LINE` through the whole header row."""
    width, height = picture.size
    pixels = picture.load()
    lines = [x for x in range(width) if all(pixels[x, y] == GRID_LINE for y in range(4, HEADER_PX))]
    edges = [0, *lines, width - 1]
    cut: list[str] = []
    for index, (left, right) in enumerate(zip(edges, edges[1:], strict=False)):
        if right - left < 8:
            continue
        touching = {y for y in range(HEADER_PX + 6, height - 2) for x in (left + 1, left + 2, right - 2, right - 1)
                    if pixels[x, y] != GRID_LINE and min(pixels[x, y]) < 170}
        if touching:
            name = heads[index] if len(heads) == len(edges) - 1 else f"column {index + 1}"
            cut.append(f'"{name}" ({right - left} px wide): text at its edge in {len(touching)} pixel rows')
    return cut


def _shot(element: Any) -> Any:
    """The element as drawn, scrolled into the window first (a screenshot stops at the window's edge)."""
    from io import BytesIO

    image = pytest.importorskip("PIL.Image", reason="needs Pillow (a Streamlit dependency) to read screenshots")
    element.parent.execute_script("arguments[0].scrollIntoView({block: 'start'})", element)
    time.sleep(0.5)
    return image.open(BytesIO(element.screenshot_as_png)).convert("RGB")


def _near(pixel: tuple[int, int, int], colour: tuple[int, ...], tolerance: int) -> bool:
    return all(abs(p - c) <= tolerance for p, c in zip(pixel, colour, strict=True))


def _colour_changes(picture: Any) -> int:
    """The most colour changes along one pixel row of the heatmap's cells (rows that are mostly
    coloured: neither white, grey nor text), a change being a step of more than 2 in a channel."""
    width, height = picture.size
    pixels = picture.load()
    most = 0
    for y in range(height):
        row = [pixels[x, y] for x in range(width)]
        coloured = [p for p in row if max(p) - min(p) > 40]
        if len(coloured) < width // 2:
            continue
        steps = zip(row, row[1:], strict=False)
        most = max(most, sum(1 for a, b in steps if max(abs(i - j) for i, j in zip(a, b, strict=True)) > 2))
    return most


def _red_apart_from_band(picture: Any) -> tuple[int, int]:
    """Of the pixel columns where the band (or its median) and the straggler's red line are both drawn:
    how many, and in how many every red pixel lies above or below the band's extent in that column."""
    width, height = picture.size
    pixels = picture.load()
    both = apart = 0
    for x in range(width):
        column = [pixels[x, y] for y in range(height)]
        band = [y for y, p in enumerate(column) if _near(p, BAND_ON_WHITE, 6) or _near(p, MEDIAN_BLUE, 12)]
        red = [y for y, p in enumerate(column) if _near(p, STRAGGLER_RED, 30)]
        if len(band) < 2 or not red:
            continue
        both += 1
        apart += all(y < min(band) - 2 or y > max(band) + 2 for y in red)
    return both, apart


def _open_and_keep(driver: Any, url: str, ready: Any, what: str, out: Path, name: str) -> None:
    driver.get(url)
    try:
        _wait(ready, 180, what)
        _wait(lambda: _settled(driver), 120, f"{name}'s script run to finish")
        time.sleep(2.0)
    finally:
        _keep(driver, out, name)


def test_demo_at_thirty_minutes(chromium: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    driver = chromium
    up = Up(tmp_path / "data", tmp_path / "up.log", env=DEMO_30_ENV)
    up.args = ["--demo"]
    problems: list[str] = []
    with up:
        simulated = re.search(r"simulated +(http\S+job=(sim-\d+))", (tmp_path / "up.log").read_text())
        assert simulated is not None, (tmp_path / "up.log").read_text()
        job_url = simulated.group(1)

        # The running job's page, on its default window, the last 15 minutes of its 30.
        _open_and_keep(driver, job_url, lambda: SAMPLED_1S in _body(driver)
                       and driver.execute_script(CHART_TITLED, "Own work per step across") is not None,
                       "the heatmap's caption and the own-work chart", tmp_path, "demo30-job-page")
        body = _body(driver)
        checked = driver.find_element(By.CSS_SELECTOR, '[data-testid="stRadio"] input:checked')
        assert checked.find_element(By.XPATH, "./ancestor::label").text.strip() == "last 15 min"
        # The drawn heatmap, not its caption: a GPU's row changes colour at about every 1 s cell of the 900.
        heatmap = driver.execute_script(CHART_BESIDE_CAPTION, SAMPLED_1S)
        assert heatmap is not None, "no chart above the sampling caption"
        heat = _shot(heatmap)
        heat.save(SHOTS / "demo30-heatmap.png")
        changes = _colour_changes(heat)
        assert changes > 3 * COARSE_CELLS, f"a heatmap row changes colour {changes} times"

        # Own work per step: rank 11's red line clear of the band and its median, in most columns.
        own = driver.execute_script(CHART_TITLED, "Own work per step across")
        picture = _shot(own)
        picture.save(SHOTS / "demo30-own-work.png")
        both, apart = _red_apart_from_band(picture)
        assert both > 200 and apart >= 0.9 * both, f"red apart from the band in {apart} of {both} columns"
        assert re.search(r"Straggler rank\(s\): 11\b", body), body
        assert "Drawn alone: 11 (straggler)" in body or "Drawn alone: rank 11 (straggler)" in body, body
        step = driver.execute_script(CHART_TITLED, "Step time across 16 ranks")
        assert step is not None and "rank 11 (straggler)" in step.text, "the step chart's legend names the straggler"
        problems += _page_problems(driver, "job")
        # Each of its details, drawn when chosen (jobsight.dashboard.job_details): tables and charts of their own.
        for token, section in job_details.TOKENS.items():
            _open_and_keep(driver, f"{job_url}&{urlencode({job_details.PARAM: token})}",
                           lambda section=section: section in _body(driver) and _settled(driver),
                           f"the job page's {section}", tmp_path, f"demo30-job-{token}")
            problems += _page_problems(driver, f"job ({section})")

        base = f"http://127.0.0.1:{up.dashboard_port}"
        frames = '[data-testid="stDataFrame"]'
        _open_and_keep(driver, f"{base}/", lambda: driver.find_elements(By.CSS_SELECTOR, frames), "the jobs list",
                       tmp_path, "demo30-jobs-page")
        problems += _page_problems(driver, "jobs")
        _open_and_keep(driver, f"{base}/audit", lambda: len(driver.find_elements(By.CSS_SELECTOR, frames)) >= 3,
                       "the audit's tables", tmp_path, "demo30-audit-page")
        problems += _page_problems(driver, "audit")
        _open_and_keep(driver, f"{base}/actions", lambda: "Steps" in _body(driver), "the actions page", tmp_path,
                       "demo30-actions-page")
        problems += _page_problems(driver, "actions")
        assert up.interrupt() == 0
    assert not problems, "\n".join(problems)
