"""Agent settings never raise: a bad value warns and falls back to the default."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from jobsight.agent.settings import AgentSettings, load_agent_settings


def test_env_overrides_toml_and_slurm_job_id_is_used(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('[agent]\nurl = "http://collector:8787"\nbatch_records = 500\n')
    settings = load_agent_settings({"JOBSIGHT_CONFIG": str(config), "JOBSIGHT_BATCH_RECORDS": "250",
                                    "SLURM_JOB_ID": "4242"})
    assert (settings.url, settings.batch_records, settings.job_id) == ("http://collector:8787", 250, "4242")


def test_bad_values_fall_back_with_a_warning(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    with caplog.at_level(logging.WARNING):
        settings = load_agent_settings({"JOBSIGHT_SAMPLE_INTERVAL_S": "fast", "JOBSIGHT_QUEUE_MAX": "-",
                                        "JOBSIGHT_CONFIG": str(tmp_path / "missing.toml")})
    defaults = AgentSettings()
    assert settings.sample_interval_s == defaults.sample_interval_s
    assert settings.queue_max == defaults.queue_max
    assert "JOBSIGHT_SAMPLE_INTERVAL_S" in caplog.text and "missing.toml" in caplog.text


def test_loopback_collector_finds_the_local_admin_token(tmp_path: Path) -> None:
    (tmp_path / "admin_token").write_text("jsa_local\n")
    local = load_agent_settings({"JOBSIGHT_DATA_DIR": str(tmp_path)})
    assert local.resolved_token() == "jsa_local"
    remote = load_agent_settings({"JOBSIGHT_DATA_DIR": str(tmp_path), "JOBSIGHT_URL": "http://collector:8787"})
    assert remote.resolved_token() is None
