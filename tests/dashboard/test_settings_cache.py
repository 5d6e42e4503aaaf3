"""The dashboard reads its settings once per process: every page and the data layer share one object,
and a Streamlit rerun does not read the TOML file again."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobsight.dashboard.settings import dashboard_settings


def test_one_read_serves_every_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "jobsight.toml"
    config.write_text("[dashboard]\ncache_ttl_s = 7\n")
    monkeypatch.setenv("JOBSIGHT_CONFIG", str(config))
    first = dashboard_settings()
    config.write_text("[dashboard]\ncache_ttl_s = 99\n")  # read again, this would say 99
    again = dashboard_settings()
    assert again is first and again.cache_ttl_s == 7
    config.unlink()  # nor is the file opened: a missing one would be an error
    assert dashboard_settings() is first


def test_other_variables_are_other_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_CACHE_TTL_S", "11")
    eleven = dashboard_settings()
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_CACHE_TTL_S", "12")
    assert (eleven.cache_ttl_s, dashboard_settings().cache_ttl_s) == (11, 12)
