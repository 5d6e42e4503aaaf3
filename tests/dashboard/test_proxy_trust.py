"""Header mode behind a real nginx, in headless Chromium: the identity header counts only from the
proxy. The browser's headers are set per request through the DevTools protocol.

nginx authenticates with HTTP basic auth and sets ``X-Forwarded-User`` to the user it
authenticated, overwriting whatever the browser sent, as docs/deployment.md's example does. It
connects to the dashboard from 127.0.0.2 (``proxy_bind``), the one address in ``trusted_proxies``,
so a browser that goes straight to the dashboard's port (from 127.0.0.1) is a client outside
``trusted_proxies`` on the same machine. A second nginx server leaves out the proxy's shared secret.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest

from jobsight.collector.store.embedded_db import free_port
from jobsight.rules import links
from tests.conftest import REPO
from tests.dashboard.seed import Seed
from tests.dashboard.test_browser import headless_chromium

SHOTS = REPO / "test-output" / "proxy"
NGINX = shutil.which("nginx", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin"]))  # not on users' PATH
ADMIN = "hpc-root"
PASSWORDS = {"alice": "alice-pw", ADMIN: "root-pw"}
SECRET_HEADER = "X-Jobsight-Proxy"


def _need_nginx() -> str:
    """nginx's path; skips without it, fails with ``JOBSIGHT_REQUIRE_BROWSER=1`` (as CI sets)."""
    if NGINX is None:
        reason = "needs Debian's nginx as the reverse proxy (apt-get install nginx)"
        if os.environ.get("JOBSIGHT_REQUIRE_BROWSER") == "1":
            pytest.fail(f"JOBSIGHT_REQUIRE_BROWSER=1 but the test {reason}")
        pytest.skip(reason)
    return NGINX


def _wait(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


# One foreground process (no master, no daemon) running as the test's user, with every path in the
# test's folder: a child the fixture stops, not a system service.
NGINX_CONF = """
daemon off;
master_process off;
pid {dir}/nginx.pid;
error_log {dir}/error.log notice;
events {{ worker_connections 64; }}
http {{
    access_log {dir}/access.log;
    client_body_temp_path {dir}/body; proxy_temp_path {dir}/proxy; fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi; scgi_temp_path {dir}/scgi;
    map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{ {common} proxy_set_header {secret_header} "{secret}"; }}
    }}
    server {{
        listen 127.0.0.1:{no_secret_port};
        location / {{ {common} }}
    }}
}}
"""

# docs/deployment.md's example, plus basic auth standing in for the site's login, and proxy_bind so that the
# dashboard tells this proxy (127.0.0.2) from a direct client on the same machine (127.0.0.1).
NGINX_LOCATION = """
    auth_basic "jobsight"; auth_basic_user_file {dir}/htpasswd;
    proxy_pass http://127.0.0.1:{dashboard_port};
    proxy_bind 127.0.0.2;
    proxy_http_version 1.1;
    proxy_set_header Upgrade $http_upgrade;
    proxy_set_header Connection $connection_upgrade;
    proxy_set_header Host $host;
    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    proxy_set_header X-Forwarded-User $remote_user;
    proxy_set_header Authorization "";
    proxy_read_timeout 1h;
"""


@dataclass
class Site:
    dashboard: str  # the dashboard's own port, straight
    proxy: str  # through nginx, which adds the shared secret
    proxy_without_secret: str
    log: Path
    seeded: Seed


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def site(seeded: Seed, database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    nginx = _need_nginx()
    work = tmp_path_factory.mktemp("proxy")
    secret = "s3cret-shared-with-nginx"
    (work / "secret").write_text(secret + "\n")
    (work / "htpasswd").write_text("".join(f"{user}:{{PLAIN}}{pw}\n" for user, pw in PASSWORDS.items()))
    dashboard_port, port, no_secret_port = free_port(), free_port(), free_port()
    env = {**os.environ, "JOBSIGHT_DATABASE_URL": database_url, "JOBSIGHT_DASHBOARD_AUTH_MODE": "header",
           "JOBSIGHT_DASHBOARD_TRUSTED_PROXIES": "127.0.0.2", "JOBSIGHT_DASHBOARD_ADMIN_USERS": ADMIN,
           "JOBSIGHT_DASHBOARD_CLUSTER": seeded.cluster, "JOBSIGHT_DASHBOARD_PROXY_SECRET_HEADER": SECRET_HEADER,
           "JOBSIGHT_DASHBOARD_PROXY_SECRET_FILE": str(work / "secret")}
    env.pop("FORWARDED_ALLOW_IPS", None)  # `jobsight dashboard` must set it itself
    log = work / "dashboard.log"
    dashboard = _start([sys.executable, "-m", "jobsight", "dashboard", "--port", str(dashboard_port)], env, log)
    common = NGINX_LOCATION.format(dir=work, dashboard_port=dashboard_port).replace("\n", " ")
    (work / "nginx.conf").write_text(NGINX_CONF.format(dir=work, port=port, no_secret_port=no_secret_port,
                                                       common=common, secret_header=SECRET_HEADER, secret=secret))
    proxy = _start([nginx, "-p", str(work), "-c", str(work / "nginx.conf"), "-e", str(work / "error.log")],
                   dict(os.environ), work / "nginx.out")
    try:
        _wait(lambda: _answers(f"http://127.0.0.1:{dashboard_port}/_stcore/health") or dashboard.poll() is not None,
              90, "the dashboard")
        assert dashboard.poll() is None, log.read_text()[-3000:]
        assert proxy.poll() is None, (work / "error.log").read_text()[-3000:]
        yield Site(f"http://127.0.0.1:{dashboard_port}", f"http://127.0.0.1:{port}",
                   f"http://127.0.0.1:{no_secret_port}", log, seeded)
    finally:
        _stop(proxy)
        _stop(dashboard)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from headless_chromium(1200)


def _open(driver: Any, url: str, headers: dict[str, str], shot: str,
          ready: Callable[[], object] = lambda: True) -> str:
    """Load ``url`` with ``headers`` on every request (the page's and its websocket's), wait for the
    script run to end and ``ready``, save a screenshot to ``SHOTS``; returns the page's text."""
    from selenium.webdriver.common.by import By

    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": headers})
    driver.get(url)

    def settled() -> bool:
        running = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stStatusWidgetRunningIcon"]')
        alert = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stAlert"]')
        heading = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stHeading"]')
        # A refusal is an alert and nothing else: done, whatever the caller waits for.
        return not running and (bool(alert) or (bool(heading) and bool(ready())))

    try:
        _wait(settled, 60, f"{url} to render")
        time.sleep(0.5)
    finally:
        SHOTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(SHOTS / f"{shot}.png"))
    return str(driver.find_element(By.TAG_NAME, "body").text)


def _basic(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()


GRID = '[data-testid="stDataFrame"] table[role="grid"]'
"""The data grid draws on a canvas; its accessible table inside holds the text."""


def _job_ids(driver: Any) -> set[str]:
    """The ``job`` column of the jobs list; empty when there is no list. The grid shows each id as its
    page's link; the accessible table holds the link, whose ``job`` parameter is the id shown."""
    from selenium.webdriver.common.by import By

    titles = [str(th.get_attribute("textContent")).strip()
              for th in driver.find_elements(By.CSS_SELECTOR, f"{GRID} th[role=columnheader]")]
    if "job" not in titles:
        return set()
    cells = driver.find_elements(By.CSS_SELECTOR, f'{GRID} td[aria-colindex="{titles.index("job") + 1}"]')
    hrefs = [str(cell.get_attribute("textContent")).strip() for cell in cells]
    return {parse_qs(urlsplit(href).query)[links.JOB][0] for href in hrefs}


def _jobs_list(driver: Any, url: str, headers: dict[str, str], shot: str) -> tuple[str, set[str]]:
    from selenium.webdriver.common.by import By

    text = _open(driver, url, headers, shot, lambda: driver.find_elements(By.CSS_SELECTOR, f"{GRID} td"))
    return text, _job_ids(driver)


@pytest.mark.browser
def test_through_the_proxy_alice_sees_only_her_jobs(site: Site, browser: Any) -> None:
    # She also sends X-Forwarded-User naming the admin: nginx overwrites it with the user it authenticated.
    headers = {"Authorization": _basic("alice"), "X-Forwarded-User": ADMIN}
    text, jobs = _jobs_list(browser, f"{site.proxy}/?range=all", headers, "proxy-alice-jobs")
    assert "Signed in as alice" in text and "Jobs of alice" in text and "(admin)" not in text
    assert jobs == {site.seeded.running, site.seeded.alice_done}
    query = urlencode({"cluster": site.seeded.cluster, "job": site.seeded.bob_idle})
    text = _open(browser, f"{site.proxy}/job?{query}", headers, "proxy-alice-opens-bobs-job")
    assert f"Job {site.seeded.bob_idle} is not your job" in text and "physics" not in text


@pytest.mark.browser
def test_through_the_proxy_an_admin_sees_every_job(site: Site, browser: Any) -> None:
    text, jobs = _jobs_list(browser, f"{site.proxy}/?range=all", {"Authorization": _basic(ADMIN)}, "proxy-admin-jobs")
    assert f"Signed in as {ADMIN} (admin)" in text
    assert jobs == {site.seeded.running, site.seeded.alice_done, site.seeded.bob_idle, site.seeded.bob_debug}


@pytest.mark.browser
def test_the_same_header_straight_to_the_dashboard_is_refused(site: Site, browser: Any) -> None:
    text = _open(browser, f"{site.dashboard}/?range=all", {"X-Forwarded-User": ADMIN}, "direct-admin-header-refused")
    assert "Sign-in refused: this connection comes from this host (loopback), not from the site's login proxy" in text
    assert "Signed in" not in text and not _job_ids(browser)
    # Logged without the name it claimed.
    _wait(lambda: "refused X-Forwarded-User from loopback" in site.log.read_text(), 10, "the refusal's log line")
    assert ADMIN not in site.log.read_text()


@pytest.mark.browser
def test_a_trusted_address_without_the_proxy_secret_is_refused(site: Site, browser: Any) -> None:
    text = _open(browser, f"{site.proxy_without_secret}/?range=all", {"Authorization": _basic(ADMIN)},
                 "proxy-without-secret-refused")
    assert "Sign-in refused: the request did not come through the site's login proxy" in text
    assert "Signed in" not in text and not _job_ids(browser)
    _wait(lambda: f"refused X-Forwarded-User from 127.0.0.2: {SECRET_HEADER} missing or wrong" in site.log.read_text(),
          10, "the refusal's log line")
    assert ADMIN not in site.log.read_text() and "s3cret" not in site.log.read_text()


@pytest.mark.parametrize("command", [["dashboard", "--host", "0.0.0.0"], ["up"]])
def test_header_mode_on_every_interface_without_trusted_proxies_refuses_to_start(command: list[str],
                                                                                 tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("JOBSIGHT_")}
    env.update({"JOBSIGHT_DASHBOARD_AUTH_MODE": "header", "JOBSIGHT_DATA_DIR": str(tmp_path / "data"),
                "JOBSIGHT_HOST": "0.0.0.0", "JOBSIGHT_PORT": str(free_port()),
                "JOBSIGHT_DASHBOARD_PORT": str(free_port())})
    done = subprocess.run([sys.executable, "-m", "jobsight", *command], env=env, capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"jobsight {command[0]}: refusing to start: header mode would take X-Forwarded-User "
                                  "from anyone who reaches 0.0.0.0: set JOBSIGHT_DASHBOARD_TRUSTED_PROXIES")
    assert not (tmp_path / "data" / "postgres").exists()  # `jobsight up` stopped before starting anything
