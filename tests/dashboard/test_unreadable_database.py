"""A dashboard whose database refuses it: every page says so in words, never a traceback, and the log
names the cause once (jobsight.dashboard.read_outage), through Streamlit's AppTest on the real server."""

from __future__ import annotations

import logging
import os
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import psycopg
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from jobsight.collector.store.embedded_db import free_port
from jobsight.commands.dashboard import streamlit_argv, streamlit_env
from tests.conftest import REPO
from tests.dashboard.conftest import APP, texts
from tests.dashboard.seed import Seed
from tests.dashboard.test_browser import headless_chromium

WRONG_PASSWORD = "not-the-password-4711"
# What a page must never show: Python's words for an error, not the reader's.
RAW = ("Traceback", "DatabaseUnavailable", "PoolTimeout", "OperationalError", "Unreadable", "psycopg", "Exception")


def _with_password(database_url: str, password: str) -> str:
    parts = urlsplit(database_url)
    user, _, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{user.split(':')[0]}:{password}@{host}"))


@pytest.fixture
def refused(monkeypatch: pytest.MonkeyPatch, database_url: str, seeded: Seed) -> Seed:
    """The dashboard's settings of the other page tests, with a wrong password in the database URL."""
    monkeypatch.setenv("JOBSIGHT_DATABASE_URL", _with_password(database_url, WRONG_PASSWORD))
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_AUTH_MODE", "oidc")
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_ADMIN_USERS", "root")
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_CLUSTER", seeded.cluster)
    st.cache_data.clear()
    return seeded


def _page(page: str | None = None, **query: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=90)
    at.user = {"is_logged_in": True, "preferred_username": "root"}
    at.run()
    if page is not None:
        at.query_params.update(query)
        at.switch_page(page).run()
    return at


def _says_it_in_words(at: AppTest) -> str:
    assert not at.exception, [e.value for e in at.exception]
    said = texts(at)
    assert "The database cannot be read just now" in said, said
    assert "refused the dashboard's login" in said and "tries again every" in said, said
    for raw in RAW:
        assert raw not in said, (raw, said)
    assert WRONG_PASSWORD not in said
    return said


def test_a_refused_password_is_said_in_words_on_every_page_and_logged_once(
        refused: Seed, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="jobsight.dashboard.reads")
    _says_it_in_words(_page())  # the jobs list
    _says_it_in_words(_page("views/job.py", cluster=refused.cluster, job=refused.running))
    _says_it_in_words(_page("views/audit.py"))
    lines = [r.getMessage() for r in caplog.records if r.name == "jobsight.dashboard.reads"]
    # Once for the outage, not once per page or read; the driver's own cause, without the password.
    assert len(lines) == 1, lines
    assert "password authentication failed" in lines[0], lines
    assert WRONG_PASSWORD not in lines[0]


def test_the_pages_read_again_when_the_database_takes_the_login(
        refused: Seed, database_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="jobsight.dashboard.reads")
    at = _page("views/job.py", cluster=refused.cluster, job=refused.running)
    _says_it_in_words(at)
    monkeypatch.setenv("JOBSIGHT_DATABASE_URL", database_url)  # the site fixed the password
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    said = texts(at)
    assert "cannot be read" not in said and f"Job {refused.running}" in said, said


def test_a_served_page_says_it_retries_and_reads_once_the_login_works(seeded: Seed, database_url: str,
                                                                      tmp_path: Path) -> None:
    """The real server in headless Chromium: the job page of a role the database refuses says so, and
    draws the job without a reload once the role's password is set (the page's own retry); the log
    names the refusal once and the recovery once."""
    from selenium.webdriver.common.by import By

    browser = headless_chromium(1600)
    driver = next(browser)
    role, password = f"reader_{uuid.uuid4().hex[:8]}", "the-password-set-later"
    admin = psycopg.connect(database_url, autocommit=True)
    # No password yet: SCRAM has no verifier, so the login fails as a wrong password does.
    admin.execute(f"CREATE ROLE {role} LOGIN")
    admin.execute(f"GRANT pg_read_all_data TO {role}")
    port, log = free_port(), tmp_path / "dashboard.log"
    url = urlunsplit(urlsplit(database_url)._replace(netloc=f"{role}:{password}@{urlsplit(database_url).hostname}:"
                                                            f"{urlsplit(database_url).port}"))
    env = streamlit_env({**os.environ, "JOBSIGHT_DATABASE_URL": url, "JOBSIGHT_DASHBOARD_AUTH_MODE": "local",
                         "JOBSIGHT_DASHBOARD_CLUSTER": seeded.cluster, "JOBSIGHT_DASHBOARD_REFRESH_S": "2"})
    with open(log, "ab") as out:
        process = subprocess.Popen(streamlit_argv("127.0.0.1", port), env=env, cwd=REPO, stdout=out,
                                   stderr=subprocess.STDOUT)
    try:
        _wait_for_health(port, process, log)
        driver.get(f"http://127.0.0.1:{port}/job?{urlencode({'cluster': seeded.cluster, 'job': seeded.running})}")
        body = _wait_for_text(driver, "The database cannot be read just now", 120)
        assert "refused the dashboard's login" in body, body
        for raw in RAW:
            assert raw not in body, (raw, body)
        assert not driver.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]'), body
        admin.execute(f"ALTER ROLE {role} PASSWORD '{password}'")
        body = _wait_for_text(driver, "Straggler rank(s): 1", 120)  # drawn by the retry: no reload
        assert "cannot be read" not in body, body
        said = log.read_text()
        assert said.count("password authentication failed") == 1, said[-3000:]
        assert said.count("reads the database again") == 1, said[-3000:]
        assert password not in said
    finally:
        process.terminate()
        process.wait(timeout=30)
        next(browser, None)
        admin.execute(f"DROP ROLE {role}")
        admin.close()


def _wait_for_health(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1):
                return
        except OSError:
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)


def _wait_for_text(driver: Any, text: str, timeout: float) -> str:
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + timeout
    while True:
        body = str(driver.find_element(By.TAG_NAME, "body").text)
        if text in body:
            return body
        assert time.monotonic() < deadline, f"no {text!r} on the page: {body[-3000:]}"
        time.sleep(0.5)
