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


def test_the_sections_come_with_the_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "jobsight.toml"
    config.write_text('[collector]\nhot_minutes = 30\n[health]\nidle_util = 7\n[reconcile]\nclusters = ["della"]\n')
    monkeypatch.setenv("JOBSIGHT_CONFIG", str(config))
    monkeypatch.setenv("JOBSIGHT_RECONCILE_INTERVAL_S", "5")
    monkeypatch.setenv("JOBSIGHT_ALERTS_GROUP_WINDOW_S", "30")
    settings = load_collector_settings()
    assert (settings.tiers.hot_minutes, settings.health.idle_util, settings.reconcile.clusters) == (30, 7, ["della"])
    assert (settings.reconcile.interval_s, settings.alerts.group_window_s) == (5, 30)


def test_every_bad_value_of_every_section_is_named_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    bad = {"JOBSIGHT_POOL_SIZE": "0", "JOBSIGHT_HOT_MINUTES": "-1", "JOBSIGHT_HEALTH_INTERVAL_S": "-5",
           "JOBSIGHT_ALERTS_GROUP_WINDOW_S": "-1", "JOBSIGHT_RECONCILE_GRACE_S": "-1"}
    for name, value in bad.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as caught:
        load_collector_settings()
    message = str(caught.value)
    assert [name for name in bad if name not in message] == []
    assert message.startswith("invalid collector settings: JOBSIGHT_POOL_SIZE")


def test_the_days_setting_hours_replaced_is_refused_with_its_successor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBSIGHT_HOT_DAYS", "1")  # a site's old setting would otherwise keep 1 h, silently
    with pytest.raises(SettingsError, match="JOBSIGHT_HOT_DAYS.*JOBSIGHT_HOT_MINUTES|JOBSIGHT_HOT_MINUTES.*HOT_DAYS"):
        load_collector_settings()


def test_an_unreadable_file_is_named_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBSIGHT_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(SettingsError) as caught:
        load_collector_settings()
    assert str(caught.value).count("missing.toml") == 1
