"""Fixtures for dashboard tests: one seeded cluster per session and AppTest factories."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from jobsight.dashboard import job_details
from tests.conftest import REPO
from tests.dashboard.seed import BigJob, Seed, seed, seed_big_job

APP = str(REPO / "dashboard" / "app.py")


@pytest.fixture(scope="session")
def seeded(database_url: str) -> Seed:
    return seed(database_url)


@pytest.fixture
def dashboard_env(monkeypatch: pytest.MonkeyPatch, database_url: str, seeded: Seed) -> Seed:
    """OIDC mode (AppTest can seed ``st.user``, a real code path) limited to the seeded cluster."""
    monkeypatch.setenv("JOBSIGHT_DATABASE_URL", database_url)
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_AUTH_MODE", "oidc")
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_ADMIN_USERS", "root")
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_CLUSTER", seeded.cluster)
    st.cache_data.clear()
    return seeded


@pytest.fixture
def app_as(dashboard_env: Seed) -> Iterator[Callable[..., AppTest]]:
    """``app_as("alice", page="views/job.py", job="a1")``: an AppTest run as that user on that page."""

    def run(user: str | None, page: str | None = None, **query: str) -> AppTest:
        at = AppTest.from_file(APP, default_timeout=60)
        at.user = {"is_logged_in": True, "preferred_username": user} if user else {"is_logged_in": False}
        at.run()
        if page is not None:
            at.query_params.update(query)
            at.switch_page(page).run()
        return at

    yield run


def texts(at: AppTest) -> str:
    """Everything the page says, for asserting presence and absence of data."""
    parts: list[Any] = []
    for kind in ("title", "header", "subheader", "markdown", "caption", "info", "warning", "error", "success"):
        parts += [element.value for element in getattr(at, kind)]
    parts += [f"{m.label} {m.value}" for m in at.metric]
    for frame in at.dataframe:
        parts.append(frame.value.to_csv())
    return "\n".join(str(p) for p in parts)


def job_sections(app_as: Callable[..., AppTest], user: str, **query: str) -> dict[str, AppTest]:
    """The job page opened once per details section (``details=<token>``), by token: the page draws one
    section at a time (:mod:`jobsight.dashboard.job_details`), so a test of the whole page reads them all."""
    return {token: app_as(user, "views/job.py", **query, **{job_details.PARAM: token}) for token in job_details.TOKENS}


def chart_titles(at: AppTest) -> list[str]:
    """The title of each chart the page draws, as its spec holds it (JSON: a title may be an object)."""
    return [json.dumps(json.loads(chart.proto.spec).get("title")) for chart in at.get("vega_lite_chart")]


def sections_texts(sections: dict[str, AppTest]) -> str:
    """Everything the job page says in any of its sections (:func:`texts` of each, joined)."""
    return "\n".join(texts(at) for at in sections.values())


@pytest.fixture(scope="session")
def big_job(database_url: str) -> BigJob:
    """A running 64-GPU job (8 nodes × 8 GPUs, a rank per GPU, 30 minutes at 1 Hz, a straggler and
    a one-minute stall) on a cluster of its own, so the seeded cluster's figures do not change."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        return seed_big_job(conn, f"big-{uuid.uuid4().hex[:8]}", "big-64", nodes=8)
