"""The dashboard's job page as a site admin (``root``) opens it, for the real-Slurm tests: the
dashboard's own sign-in path (OIDC mode, an admin user) over the test cluster's database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def open_job_page(database_url: str, job: str, monkeypatch: pytest.MonkeyPatch, **query: str) -> Any:
    """The rendered page (a ``streamlit.testing.v1.AppTest``), checked to have raised nothing; ``query``:
    more of its address (``details="profiles"`` opens its profiles, jobsight.dashboard.job_details)."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    for name, value in (("JOBSIGHT_DATABASE_URL", database_url), ("JOBSIGHT_DASHBOARD_AUTH_MODE", "oidc"),
                        ("JOBSIGHT_DASHBOARD_ADMIN_USERS", "root"), ("JOBSIGHT_DASHBOARD_CLUSTER", "default")):
        monkeypatch.setenv(name, value)
    st.cache_data.clear()
    at = AppTest.from_file(str(REPO / "dashboard" / "app.py"), default_timeout=60)
    at.user = {"is_logged_in": True, "preferred_username": "root"}
    at.run()
    at.query_params.update({"cluster": "default", "job": job, **query})
    at.switch_page("views/job.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at
