"""Who the viewer is, in each auth mode, and local mode's loopback-only rule."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from streamlit import config
from streamlit.testing.v1 import AppTest

from jobsight.collector.settings import SettingsError
from jobsight.dashboard.identity import Refusal, Viewer, is_loopback, resolve_viewer
from jobsight.dashboard.settings import load_dashboard_settings
from tests.dashboard.conftest import APP, texts
from tests.dashboard.seed import Seed


def test_header_mode_reads_the_configured_header_and_admin_groups() -> None:
    settings = load_dashboard_settings(auth_mode="header", identity_header="X-Remote-User",
                                       groups_header="X-Remote-Groups", admin_users="root", admin_groups="hpc-admins")
    assert resolve_viewer(settings, headers={"x-remote-user": "alice"}, user=None, server_address="0.0.0.0") == \
        Viewer("alice", False)
    assert resolve_viewer(settings, headers={"X-Remote-User": "carol", "X-Remote-Groups": "users, hpc-admins"},
                          user=None, server_address="0.0.0.0") == Viewer("carol", True)
    assert resolve_viewer(settings, headers={"X-Remote-User": "root"}, user=None, server_address=None).is_admin
    refused = resolve_viewer(settings, headers={"X-Forwarded-User": "alice"}, user=None, server_address="0.0.0.0")
    assert isinstance(refused, Refusal) and "X-Remote-User" in refused.reason


def test_oidc_mode_uses_the_claim_then_the_email() -> None:
    settings = load_dashboard_settings(auth_mode="oidc", admin_users="root")
    assert resolve_viewer(settings, headers={}, user={"is_logged_in": True, "preferred_username": "root"},
                          server_address=None) == Viewer("root", True)
    assert resolve_viewer(settings, headers={}, user={"is_logged_in": True, "email": "bob@example.org"},
                          server_address=None) == Viewer("bob", False)
    assert resolve_viewer(settings, headers={"X-Forwarded-User": "root"}, user={"is_logged_in": False},
                          server_address="127.0.0.1") == Refusal("Please log in.", login=True)


@pytest.mark.parametrize("address, allowed", [("127.0.0.1", True), ("::1", True), ("localhost", True),
                                              ("0.0.0.0", False), ("", False), (None, False), ("10.1.2.3", False)])
def test_local_mode_only_on_loopback(address: str | None, allowed: bool) -> None:
    assert is_loopback(address) is allowed
    found = resolve_viewer(load_dashboard_settings(auth_mode="local"), headers={"X-Forwarded-User": "x"},
                           user=None, server_address=address)
    assert (found == Viewer("local", True)) is allowed


def test_a_bad_setting_is_named() -> None:
    with pytest.raises(SettingsError, match="JOBSIGHT_DASHBOARD_AUTH_MODE"):
        load_dashboard_settings(auth_mode="none")


@pytest.fixture
def server_address() -> Iterator[None]:
    before = config.get_option("server.address")
    yield
    config.set_option("server.address", before)


@pytest.mark.usefixtures("server_address")
def test_local_mode_app_refuses_off_loopback_and_serves_on_it(monkeypatch: pytest.MonkeyPatch,
                                                               dashboard_env: Seed) -> None:
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_AUTH_MODE", "local")
    config.set_option("server.address", "0.0.0.0")
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert "only when the dashboard listens on loopback" in texts(at) and not at.dataframe
    config.set_option("server.address", "127.0.0.1")
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception and "Signed in as **local** (admin)" in texts(at)
