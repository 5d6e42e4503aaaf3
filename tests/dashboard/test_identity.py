"""Who the viewer is, in each auth mode, local mode's loopback-only rule, and whom header mode believes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from streamlit import config
from streamlit.testing.v1 import AppTest

from jobsight.collector.config.settings import SettingsError
from jobsight.dashboard.identity import Refusal, Viewer, resolve_viewer
from jobsight.dashboard.proxy_trust import bind_problem, is_loopback, peer_is_trusted, trusted_networks
from jobsight.dashboard.settings import DashboardSettings, load_dashboard_settings
from tests.dashboard.conftest import APP, texts
from tests.dashboard.seed import Seed


def _ask(settings: DashboardSettings, headers: dict[str, str], *, peer: str | None = None,
         server_address: str | None = "127.0.0.1", peer_is_real: bool = True) -> Viewer | Refusal:
    """Header mode's answer to one connection; ``peer=None`` is a loopback peer as Streamlit reports it."""
    return resolve_viewer(settings, headers=headers, user=None, server_address=server_address, peer=peer,
                          peer_is_real=peer_is_real)


def test_header_mode_reads_the_configured_header_and_admin_groups() -> None:
    settings = load_dashboard_settings(auth_mode="header", identity_header="X-Remote-User",
                                       groups_header="X-Remote-Groups", admin_users="root", admin_groups="hpc-admins")
    assert _ask(settings, {"x-remote-user": "alice"}) == Viewer("alice", False)
    assert _ask(settings, {"X-Remote-User": "carol", "X-Remote-Groups": "users, hpc-admins"}) == Viewer("carol", True)
    assert _ask(settings, {"X-Remote-User": "root"}, peer="127.0.0.9").is_admin  # type: ignore[union-attr]
    refused = _ask(settings, {"X-Forwarded-User": "alice"})
    assert isinstance(refused, Refusal) and "X-Remote-User" in refused.reason and refused.logged is None


def test_header_mode_believes_only_peers_in_trusted_proxies() -> None:
    settings = load_dashboard_settings(auth_mode="header", admin_users="hpc-root",
                                       trusted_proxies="127.0.0.2, 10.0.0.0/8, fd00::/8")
    claim = {"X-Forwarded-User": "hpc-root"}
    for proxy in ("127.0.0.2", "10.3.4.5", "::ffff:10.3.4.5", "fd00::17"):
        assert _ask(settings, claim, peer=proxy, server_address="0.0.0.0") == Viewer("hpc-root", True), proxy
    for direct in (None, "127.0.0.3", "192.168.1.7", "fe80::1", "not-an-address"):
        refused = _ask(settings, claim, peer=direct, server_address="0.0.0.0")
        assert isinstance(refused, Refusal) and "not from the site's login proxy" in refused.reason, direct
        # The log names the header and the peer, never the name the peer claimed.
        assert refused.logged is not None and "X-Forwarded-User" in refused.logged
        assert "hpc-root" not in refused.logged + refused.reason
    # Without anything configured, only loopback: a proxy on the dashboard's own host.
    default = load_dashboard_settings(auth_mode="header")
    assert trusted_networks(default) == trusted_networks(load_dashboard_settings(trusted_proxies="127.0.0.0/8,::1"))
    assert _ask(default, claim) == Viewer("hpc-root", False) == _ask(default, claim, peer="127.0.0.2")
    assert isinstance(_ask(default, claim, peer="10.0.0.1"), Refusal)
    # Streamlit reports both loopback peers as None: trusted when either is.
    assert peer_is_trusted(None, trusted_networks(load_dashboard_settings(trusted_proxies="::1")))
    assert not peer_is_trusted(None, trusted_networks(load_dashboard_settings(trusted_proxies="")))


def test_header_mode_asks_for_the_proxy_secret_when_one_is_set(tmp_path: Path) -> None:
    secret_file = tmp_path / "proxy_secret"
    secret_file.write_text("  correct horse battery\n")
    settings = load_dashboard_settings(auth_mode="header", trusted_proxies="0.0.0.0/0",
                                       proxy_secret_header="X-Jobsight-Proxy", proxy_secret_file=str(secret_file))
    assert "correct horse" not in repr(settings)
    claim = {"X-Forwarded-User": "alice"}
    assert _ask(settings, {**claim, "x-jobsight-proxy": "correct horse battery"}, peer="203.0.113.9") == \
        Viewer("alice", False)
    for sent in ({}, {"X-Jobsight-Proxy": "correct horse"}, {"X-Jobsight-Proxy": "correct horse battery staple"}):
        refused = _ask(settings, {**claim, **sent}, peer="203.0.113.9")
        assert isinstance(refused, Refusal) and refused.logged is not None, sent
        assert "X-Jobsight-Proxy" in refused.logged
        assert "correct" not in refused.logged and "alice" not in refused.logged
    # The secret does not stand in for the address: a peer outside trusted_proxies is refused with it.
    narrow = settings.model_copy(update={"trusted_proxies": trusted_networks(load_dashboard_settings())})
    assert isinstance(_ask(narrow, {**claim, "X-Jobsight-Proxy": "correct horse battery"}, peer="203.0.113.9"),
                      Refusal)


@pytest.mark.parametrize("overrides, named", [
    ({"trusted_proxies": "127.0.0.2, proxy.example.org"}, "JOBSIGHT_DASHBOARD_TRUSTED_PROXIES"),
    ({"proxy_secret_header": "X-Jobsight-Proxy"}, "JOBSIGHT_DASHBOARD_PROXY_SECRET_FILE"),
    ({"proxy_secret_header": "X-Jobsight-Proxy", "proxy_secret_file": "/nonexistent/secret"},
     "JOBSIGHT_DASHBOARD_PROXY_SECRET_FILE: cannot read"),
])
def test_bad_proxy_settings_are_named(overrides: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match=named):
        load_dashboard_settings(**overrides)


def test_header_mode_off_loopback_needs_trusted_proxies_set() -> None:
    unset = load_dashboard_settings(auth_mode="header")
    for address in ("0.0.0.0", "10.1.2.3", "", None):
        problem = bind_problem(unset, address)
        assert problem is not None and "JOBSIGHT_DASHBOARD_TRUSTED_PROXIES" in problem and "\n" not in problem
        # The same rule holds in the page, for a dashboard started some other way.
        refused = _ask(unset, {"X-Forwarded-User": "alice"}, server_address=address)
        assert isinstance(refused, Refusal) and "JOBSIGHT_DASHBOARD_TRUSTED_PROXIES" in refused.reason
    assert bind_problem(unset, "127.0.0.1") is None and bind_problem(unset, "::1") is None
    assert bind_problem(load_dashboard_settings(auth_mode="header", trusted_proxies="10.0.0.2"), "0.0.0.0") is None
    assert bind_problem(load_dashboard_settings(auth_mode="oidc"), "0.0.0.0") is None


def test_header_mode_refuses_a_server_that_rewrites_the_peer_address() -> None:
    refused = _ask(load_dashboard_settings(auth_mode="header"), {"X-Forwarded-User": "alice"}, peer_is_real=False)
    assert isinstance(refused, Refusal) and "jobsight dashboard" in refused.reason
    assert refused.logged is not None and "FORWARDED_ALLOW_IPS" in refused.logged


def test_oidc_mode_uses_the_claim_and_an_email_only_where_allowed() -> None:
    """The rest of OIDC mode's rules are in tests/dashboard/test_oidc_claims.py."""
    settings = load_dashboard_settings(auth_mode="oidc", admin_users="root")
    assert resolve_viewer(settings, headers={}, user={"is_logged_in": True, "preferred_username": "root"},
                          server_address=None, peer=None, peer_is_real=True) == Viewer("root", True)
    verified = {"is_logged_in": True, "email": "bob@example.org", "email_verified": True}
    refused = resolve_viewer(settings, headers={}, user=verified, server_address=None, peer=None, peer_is_real=True)
    assert isinstance(refused, Refusal) and refused.logout and not refused.login
    allowed = settings.model_copy(update={"oidc_email_domains": ("example.org",)})
    assert resolve_viewer(allowed, headers={}, user=verified, server_address=None, peer=None,
                          peer_is_real=True) == Viewer("bob", False)
    assert resolve_viewer(settings, headers={"X-Forwarded-User": "root"}, user={"is_logged_in": False},
                          server_address="127.0.0.1", peer=None, peer_is_real=True) == \
        Refusal("Please log in.", login=True)


@pytest.mark.parametrize("address, allowed", [("127.0.0.1", True), ("::1", True), ("localhost", True),
                                              ("0.0.0.0", False), ("", False), (None, False), ("10.1.2.3", False)])
def test_local_mode_only_on_loopback(address: str | None, allowed: bool) -> None:
    assert is_loopback(address) is allowed
    found = resolve_viewer(load_dashboard_settings(auth_mode="local"), headers={"X-Forwarded-User": "x"},
                           user=None, server_address=address, peer=None, peer_is_real=True)
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


@pytest.mark.usefixtures("server_address")
def test_header_mode_app_shows_a_refusal_page_and_logs_it_once(monkeypatch: pytest.MonkeyPatch, dashboard_env: Seed,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A header-mode dashboard started some other way than ``jobsight dashboard`` (here: AppTest)
    serves nothing while it listens everywhere without trusted_proxies, or while its server may take
    the peer address from X-Forwarded-For (uvicorn's default); each refusal is logged once a session."""
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_AUTH_MODE", "header")
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)
    config.set_option("server.address", "0.0.0.0")
    with caplog.at_level("WARNING", logger="jobsight.dashboard.identity"):
        at = AppTest.from_file(APP, default_timeout=60).run()
        assert [error.value for error in at.error] == [
            "This dashboard refuses to serve: header mode would take X-Forwarded-User from anyone who reaches "
            "0.0.0.0: set JOBSIGHT_DASHBOARD_TRUSTED_PROXIES (trusted_proxies in [dashboard]) to the proxy's "
            "addresses, or listen on 127.0.0.1 behind a local proxy."]
        config.set_option("server.address", "127.0.0.1")
        at = AppTest.from_file(APP, default_timeout=60).run()
        at.run()
    assert [error.value for error in at.error] == [
        "This dashboard refuses to serve: start it with `jobsight dashboard`, which keeps Streamlit from taking "
        "the client's address from X-Forwarded-For."]
    assert not at.dataframe and "Signed in" not in texts(at)
    logged = [r.getMessage() for r in caplog.records if r.name == "jobsight.dashboard.identity"]
    assert len(logged) == 2 and logged[1] == \
        "refused to serve: header mode needs FORWARDED_ALLOW_IPS='' in Streamlit's environment"
    # With both right, AppTest's connection has no real peer address (a stand-in object): refused too.
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "")
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert "not from the site's login proxy" in texts(at) and not at.dataframe
