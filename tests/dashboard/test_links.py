"""Every dashboard page has an address that reproduces it (jobsight.rules.links, dashboard/url_state.py).

AppTest: the jobs list, the audit and the Attention page start from their query parameters and
write them back; the root address forwards to ``/jobs``; a job link with ``t`` opens the window
around that moment and scrolls to it once. Headless Chromium against ``jobsight up`` over the
seeded database (as test_browser.py): ``/jobs`` opens the jobs list, not Streamlit's "Page not
found"; a job link with ``t`` built under the collector's public URL opens that job scrolled to the
marked moment; an audit link opens that period; changing a filter updates the address bar.
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest
from streamlit.testing.v1 import AppTest

from jobsight.rules import links
from tests.collector.test_up import Up
from tests.dashboard.conftest import APP, texts
from tests.dashboard.seed import PERIOD, TOTAL_GPU_HOURS, Seed
from tests.dashboard.test_browser import _wait, headless_chromium

UTC = dt.UTC


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def _open(user: str, page: str, query: dict[str, str]) -> AppTest:
    """As conftest's ``app_as``, with the query as a mapping: the jobs list's filter ``user`` is a
    query parameter here."""
    at = AppTest.from_file(APP, default_timeout=60)
    at.user = {"is_logged_in": True, "preferred_username": user}
    at.run()
    at.query_params.update(query)
    return at.switch_page(page).run()


def _jobs(at: AppTest) -> list[str]:
    return list(at.dataframe[0].value["job"]) if at.dataframe else []


def _running_since(database_url: str, seeded: Seed) -> dt.datetime:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT start_time FROM jobs WHERE cluster = %s AND job_id = %s",
                           (seeded.cluster, seeded.running)).fetchone()
    assert row is not None
    start: dt.datetime = row[0]
    return start


# -- AppTest -------------------------------------------------------------------------------------


def test_jobs_filters_come_from_the_address_and_go_back_to_it(dashboard_env: Seed) -> None:
    at = _open("root", "views/jobs.py", {"user": "bob", "range": "all", "below": "10"})
    _ok(at)
    assert at.text_input(key="jobs_user").value == "bob"
    assert at.selectbox(key="jobs_range").value == "all time"
    assert at.number_input(key="jobs_below").value == 10.0
    assert _jobs(at) == [dashboard_env.bob_idle]
    assert at.query_params == {"user": "bob", "range": "all", "below": "10"}

    at.number_input(key="jobs_below").set_value(None).run()  # back to its default: left out of the address
    at.selectbox(key="jobs_state").set_value("completed").run()
    _ok(at)
    assert at.query_params == {"user": "bob", "range": "all", "state": "completed"}
    assert set(_jobs(at)) == {dashboard_env.bob_idle, dashboard_env.bob_debug}
    at.selectbox(key="jobs_range").set_value("last 7 days").run()
    assert at.query_params == {"user": "bob", "state": "completed"}


def test_a_hand_edited_jobs_address_shows_the_defaults_and_says_so_in_the_address(dashboard_env: Seed) -> None:
    at = _open("alice", "views/jobs.py", {"state": "sleeping", "range": "forever", "below": "250", "user": "bob"})
    _ok(at)
    assert at.selectbox(key="jobs_state").value == "any" and at.selectbox(key="jobs_range").value == "last 7 days"
    assert at.number_input(key="jobs_below").value is None
    assert at.query_params == {}  # alice has no user filter: her own jobs whatever the address says
    assert _jobs(at) == [dashboard_env.running]


def test_the_root_address_forwards_to_the_jobs_list_with_its_filters(dashboard_env: Seed) -> None:
    at = AppTest.from_file(APP, default_timeout=60)
    at.user = {"is_logged_in": True, "preferred_username": "alice"}
    at.query_params.update({"range": "all", "state": "completed"})
    at.run()
    _ok(at)
    assert [t.value for t in at.title] == ["Jobs of alice"]
    assert _jobs(at) == [dashboard_env.alice_done]
    assert at.query_params == {"range": "all", "state": "completed"}


def test_audit_period_and_thresholds_come_from_the_address(app_as: Callable[..., AppTest],
                                                           dashboard_env: Seed) -> None:
    at = app_as("root", "views/audit.py", **links.audit_query(*PERIOD), idle="3.5")
    _ok(at)
    assert (at.date_input(key="audit_from").value, at.date_input(key="audit_to").value) == PERIOD
    assert at.number_input(key="audit_idle").value == 3.5
    assert {m.label: m.value for m in at.metric}["GPU-hours"] == f"{TOTAL_GPU_HOURS:.2f}"
    assert at.query_params == {"from": "2024-03-04", "to": "2024-03-05", "idle": "3.5"}
    at.number_input(key="audit_low").set_value(50.0).run()
    at.date_input(key="audit_to").set_value(dt.date(2024, 3, 4)).run()
    _ok(at)
    assert at.query_params == {"from": "2024-03-04", "to": "2024-03-04", "idle": "3.5", "low": "50"}


def test_the_audit_writes_its_default_period_so_a_copied_address_keeps_it(app_as: Callable[..., AppTest],
                                                                           dashboard_env: Seed) -> None:
    at = app_as("root", "views/audit.py")
    _ok(at)
    today = dt.datetime.now(UTC).date()
    assert at.query_params == {"from": (today - dt.timedelta(days=6)).isoformat(), "to": today.isoformat()}


def test_attention_filters_come_from_the_address(app_as: Callable[..., AppTest], dashboard_env: Seed) -> None:
    at = app_as("root", "views/attention.py", rule="hung_rank", severity="info")
    _ok(at)
    assert at.selectbox(key="attention_rule").value == "hung_rank"
    assert at.selectbox(key="attention_severity").value == "info"
    at.selectbox(key="attention_rule").set_value("any").run()
    assert at.query_params == {"severity": "info"}


def _scroll_scripts(at: AppTest) -> list[str]:
    return [h.proto.body for h in at.get("html") if "scrollIntoView" in h.proto.body]


def test_a_job_link_with_t_opens_the_window_around_it_and_scrolls_there_once(
        app_as: Callable[..., AppTest], dashboard_env: Seed, database_url: str) -> None:
    moment = _running_since(database_url, dashboard_env) + dt.timedelta(minutes=15)
    # On its logs, for their level filter: a widget of the page's own to rerun it with.
    at = app_as("alice", "views/job.py", **links.job_query(dashboard_env.cluster, dashboard_env.running, moment),
                details="logs")
    _ok(at)
    heading = next(s for s in at.subheader if s.value.startswith("Around"))
    assert heading.value == f"Around {moment:%Y-%m-%d %H:%M:%S} UTC" and heading.proto.anchor == "moment"
    assert len(_scroll_scripts(at)) == 1
    at.selectbox(key="log_level").set_value("WARNING").run()  # any rerun of the page
    _ok(at)
    assert not _scroll_scripts(at)  # the reader's own scrolling is left alone
    assert "Around" in texts(at)


def test_a_job_link_with_a_t_that_is_no_time_shows_the_whole_run(app_as: Callable[..., AppTest],
                                                                  dashboard_env: Seed) -> None:
    at = app_as("alice", "views/job.py", cluster=dashboard_env.cluster, job=dashboard_env.running, t="noon")
    _ok(at)
    assert "The link's moment 'noon' is not a time; showing the whole run." in texts(at)
    assert not _scroll_scripts(at) and "Around" not in texts(at)


# -- headless Chromium -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def stack(database_url: str, seeded: Seed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """``jobsight up`` on loopback (local mode: an admin) over the seeded database."""
    tmp = tmp_path_factory.mktemp("links-up")
    with Up(tmp / "data", tmp / "up.log", env={"JOBSIGHT_DATABASE_URL": database_url,
                                               "JOBSIGHT_DASHBOARD_CLUSTER": seeded.cluster}) as up:
        yield up
        assert up.interrupt() == 0


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """A window short enough that the job page must scroll to show a moment."""
    yield from headless_chromium(900)


def _body(driver: Any) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.TAG_NAME, "body").text)


def _settled(driver: Any) -> bool:
    from selenium.webdriver.common.by import By

    running = driver.find_elements(By.CSS_SELECTOR,
                                   '[data-testid="stStatusWidget"] [data-testid="stStatusWidgetRunningIcon"]')
    return not running and bool(driver.find_elements(By.CSS_SELECTOR, '[data-testid="stHeading"]'))


def _keep(driver: Any, out: Path, name: str) -> None:
    driver.save_screenshot(str(out / f"{name}.png"))
    (out / f"{name}.html").write_text(driver.page_source)


def _query(driver: Any) -> dict[str, list[str]]:
    return parse_qs(urlsplit(driver.current_url).query)


@pytest.mark.browser
def test_jobs_address_opens_the_jobs_list_and_a_filter_updates_the_address(
        chromium: Any, stack: Up, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver = chromium
    dashboard = f"http://127.0.0.1:{stack.dashboard_port}"
    driver.get(f"{dashboard}/{links.jobs_link({'range': 'all'})}")
    partition_input = 'input[aria-label="Partition"]'
    try:
        _wait(lambda: "4 job(s)" in _body(driver), 90, "the jobs list of the seeded cluster")
        _wait(lambda: _settled(driver), 60, "the jobs page's script run to finish")
        _wait(lambda: driver.find_elements(By.CSS_SELECTOR, partition_input), 60, "the filters to be drawn")
    finally:
        _keep(driver, tmp_path, "jobs")
    assert "Page not found" not in _body(driver)
    assert urlsplit(driver.current_url).path == "/jobs" and _query(driver) == {"range": ["all"]}

    driver.find_element(By.CSS_SELECTOR, partition_input).send_keys("gpu", Keys.ENTER)
    try:
        _wait(lambda: _query(driver).get("partition") == ["gpu"], 60, "the partition filter in the address")
        _wait(lambda: "3 job(s)" in _body(driver), 60, "the jobs list filtered by partition")
    finally:
        _keep(driver, tmp_path, "jobs-filtered")
    assert _query(driver) == {"range": ["all"], "partition": ["gpu"]}

    driver.get(f"{dashboard}/")  # the root address forwards to the list's own
    _wait(lambda: urlsplit(driver.current_url).path == "/jobs", 60, "the root address to become /jobs")
    _wait(lambda: "job(s)" in _body(driver), 60, "the jobs list at the root address")
    assert "Page not found" not in _body(driver)


# Where the window's heading is in the view, how far the page is scrolled, and how many charts lie
# between the heading and the window's "Hide this window" link.
_MOMENT_VIEW = """
const heading = document.getElementById("moment");
if (!heading) return null;
let scrolled = document.scrollingElement.scrollTop;
for (let node = heading.parentElement; node; node = node.parentElement) scrolled += node.scrollTop;
const hide = [...document.querySelectorAll('a')].find(a => a.textContent.includes("Hide this window"));
const charts = [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')].filter(c =>
    heading.compareDocumentPosition(c) & Node.DOCUMENT_POSITION_FOLLOWING
    && hide && (hide.compareDocumentPosition(c) & Node.DOCUMENT_POSITION_PRECEDING));
return {top: heading.getBoundingClientRect().top, scrolled: scrolled, text: heading.textContent,
        charts: charts.length};
"""


@pytest.mark.browser
def test_job_link_with_t_opens_the_job_scrolled_to_the_marked_moment(
        chromium: Any, stack: Up, seeded: Seed, database_url: str, tmp_path: Path) -> None:
    # The link as `jobsight report` builds it: under the public URL the collector's summary gives.
    request = urllib.request.Request(f"{stack.url}/v1/jobs/{seeded.running}/summary?cluster={seeded.cluster}",
                                     headers={"Authorization": f"Bearer {stack.token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        base = json.loads(response.read())["dashboard_base_url"]
    moment = _running_since(database_url, seeded) + dt.timedelta(minutes=15)
    url = links.job_link(seeded.cluster, seeded.running, moment, base=base)
    assert url.startswith(f"http://127.0.0.1:{stack.dashboard_port}/job?")

    driver = chromium
    driver.get(url)
    view: dict[str, Any] = {}

    def scrolled_to_the_moment() -> bool:
        view.clear()
        view.update(driver.execute_script(_MOMENT_VIEW) or {})
        return bool(view) and view["scrolled"] > 0 and 0 <= view["top"] <= 150

    try:
        _wait(scrolled_to_the_moment, 90, "the page scrolled to the moment's window")
        _wait(lambda: _settled(driver), 60, "the job page's script run to finish")
        _wait(lambda: (driver.execute_script(_MOMENT_VIEW) or {}).get("charts") == 2, 60,
              "the window's heatmap and step chart")
    finally:
        _keep(driver, tmp_path, "job-at-moment")
    assert view["text"].startswith(f"Around {moment:%Y-%m-%d %H:%M:%S} UTC"), view
    assert f"Job {seeded.running}" in _body(driver)
    assert "the red line marks the moment" in _body(driver)


@pytest.mark.browser
def test_audit_link_opens_the_audit_of_its_period(chromium: Any, stack: Up, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    driver = chromium
    driver.get(links.audit_link(*PERIOD, base=f"http://127.0.0.1:{stack.dashboard_port}"))

    def figures() -> dict[str, str]:
        return {m.find_element(By.CSS_SELECTOR, '[data-testid="stMetricLabel"]').text.strip():
                m.find_element(By.CSS_SELECTOR, '[data-testid="stMetricValue"]').text.strip()
                for m in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stMetric"]')}

    try:
        _wait(lambda: figures().get("Jobs") == "3", 90, "the audit of the seeded period")
        _wait(lambda: _settled(driver), 60, "the audit page's script run to finish")
    finally:
        _keep(driver, tmp_path, "audit")
    assert figures()["GPU-hours"] == f"{TOTAL_GPU_HOURS:.2f}"
    assert _query(driver) == {"from": ["2024-03-04"], "to": ["2024-03-05"]}
    shown = [str(i.get_attribute("value")).replace("/", "-")
             for i in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stDateInput"] input')]
    assert shown == ["2024-03-04", "2024-03-05"]  # the period's widgets, whichever way the locale writes a day
