"""Collector settings: env over TOML, bad values named."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobsight.collector.config.settings import SettingsError, load_collector_settings


def test_toml_then_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "jobsight.toml"
    config.write_text('[collector]\nport = 9000\ncluster = "della"\nretention_days = 30\n')
    monkeypatch.setenv("JOBSIGHT_CONFIG", str(config))
    monkeypatch.setenv("JOBSIGHT_RETENTION_DAYS", "7")
    settings = load_collector_settings()
    assert (settings.port, settings.cluster, settings.retention_days) == (9000, "della", 7)


def test_bad_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBSIGHT_POOL_SIZE", "0")
    with pytest.raises(SettingsError, match="JOBSIGHT_POOL_SIZE"):
        load_collector_settings()


def test_broken_toml_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "broken.toml"
    config.write_text("[collector\nport = ")
    monkeypatch.setenv("JOBSIGHT_CONFIG", str(config))
    with pytest.raises(SettingsError, match="broken.toml"):
        load_collector_settings()
