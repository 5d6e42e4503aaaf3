"""OIDC mode's user name and admin rights from the claims as Streamlit's ``st.user`` carries them.

Where the identity provider accepts any account, anyone can log in as ``hpcadmin@gmail.com``: the
name comes from the configured claim, an e-mail names a user only when verified and in a listed
domain, and admin rights come only from the configured admin users and groups. The claims below
have the shape of Streamlit's login cookie (the ID token's claims plus ``is_logged_in``, ``origin``
and ``provider``); the page tests set them on a real ``AppTest`` run of the dashboard.
"""

from __future__ import annotations

from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from jobsight.collector.config.settings import SettingsError
from jobsight.dashboard.identity import Refusal, Viewer, resolve_viewer
from jobsight.dashboard.settings import DashboardSettings, load_dashboard_settings
from tests.dashboard.conftest import APP, texts
from tests.dashboard.seed import Seed

# A site whose provider may send no preferred_username: addresses of site.edu name its users.
SITE = load_dashboard_settings(auth_mode="oidc", admin_users="hpcadmin, boss@site.edu", admin_groups="hpc-admins",
                               oidc_email_domains="site.edu")
DEFAULT = load_dashboard_settings(auth_mode="oidc", admin_users="hpcadmin", admin_groups="hpc-admins")


def _claims(**claims: Any) -> dict[str, Any]:
    return {"iss": "https://idp.example.org", "sub": "248289761001", "aud": "jobsight", **claims,
            "origin": "https://dashboard.example.org", "is_logged_in": True, "provider": "default"}


def _who(settings: DashboardSettings, claims: dict[str, Any]) -> Viewer | Refusal:
    return resolve_viewer(settings, headers={}, user=claims, server_address="0.0.0.0", peer=None, peer_is_real=True)


def _refused(settings: DashboardSettings, claims: dict[str, Any], says: str, logs: str) -> None:
    found = _who(settings, claims)
    assert isinstance(found, Refusal), found
    assert found.logout and not found.login
    assert says in found.reason
    assert found.logged is not None and logs in found.logged
    # Neither the page nor the log repeats the address someone claimed.
    assert "@" not in found.reason + found.logged


@pytest.mark.parametrize("settings", [DEFAULT, SITE], ids=["no-domains", "site.edu"])
@pytest.mark.parametrize("verified", [False, None, "true", 1], ids=["false", "absent", "string", "one"])
def test_an_unverified_email_names_no_one(settings: DashboardSettings, verified: object) -> None:
    claims = _claims(email="hpcadmin@gmail.com", groups=[])
    if verified is not None:
        claims["email_verified"] = verified
    if settings is DEFAULT:
        _refused(settings, claims, "takes names only from that claim",
                 "without claim 'preferred_username': JOBSIGHT_DASHBOARD_OIDC_EMAIL_DOMAINS is empty")
    else:
        _refused(settings, claims, "not verified", "email_verified is not true")
    # Nor in the listed domain: verification is asked for first.
    _refused(SITE, {**claims, "email": "hpcadmin@site.edu"}, "not verified", "email_verified is not true")


def test_a_verified_email_outside_the_listed_domains_names_no_one() -> None:
    for email in ("hpcadmin@gmail.com", "hpcadmin@evil-site.edu", "hpcadmin@sub.site.edu", "hpcadmin@site.edu.evil"):
        _refused(SITE, _claims(email=email, email_verified=True), "not in a domain this dashboard accepts",
                 "e-mail domain not in JOBSIGHT_DASHBOARD_OIDC_EMAIL_DOMAINS")
    # With no domains listed (the default), a verified address names no one either.
    _refused(DEFAULT, _claims(email="alice@site.edu", email_verified=True), "takes names only from that claim",
             "JOBSIGHT_DASHBOARD_OIDC_EMAIL_DOMAINS is empty")


def test_a_verified_email_in_a_listed_domain_names_its_local_part_but_makes_no_admin() -> None:
    assert _who(SITE, _claims(email="alice@site.edu", email_verified=True)) == Viewer("alice", False)
    assert _who(SITE, _claims(email="alice@SITE.EDU", email_verified=True)) == Viewer("alice", False)
    # "hpcadmin" is in admin_users, but a name derived from an address is never matched against it.
    assert _who(SITE, _claims(email="hpcadmin@site.edu", email_verified=True)) == Viewer("hpcadmin", False)
    # An address itself listed in admin_users is explicit configuration, as is a configured group.
    assert _who(SITE, _claims(email="Boss@Site.edu", email_verified=True)) == Viewer("Boss", True)
    assert _who(SITE, _claims(email="carol@site.edu", email_verified=True, groups=["hpc-admins"])) == \
        Viewer("carol", True)
    # A local part no cluster account could have is refused rather than compared with job owners.
    for odd in ("alice+jobs@site.edu", '"a@b"@site.edu', "@site.edu", "al ice@site.edu"):
        found = _who(SITE, _claims(email=odd, email_verified=True))
        assert isinstance(found, Refusal) and found.logout, odd


def test_the_configured_claim_names_the_user_whatever_the_email() -> None:
    unverified = {"email": "someone@gmail.com", "email_verified": False}
    assert _who(DEFAULT, _claims(preferred_username="hpcadmin", **unverified)) == Viewer("hpcadmin", True)
    assert _who(DEFAULT, _claims(preferred_username="alice", **unverified)) == Viewer("alice", False)
    # Another claim when configured; preferred_username then counts for nothing.
    uid = load_dashboard_settings(auth_mode="oidc", oidc_user_claim="uid", admin_users="hpcadmin")
    assert _who(uid, _claims(uid="alice", preferred_username="hpcadmin")) == Viewer("alice", False)
    _refused(uid, _claims(preferred_username="hpcadmin", email="hpcadmin@site.edu", email_verified=True),
             "no 'uid' claim", "without claim 'uid'")
    # A claim that is there but is no name is refused, not replaced by the e-mail.
    for bad in (["hpcadmin"], 42, "   "):
        _refused(SITE, _claims(preferred_username=bad, email="alice@site.edu", email_verified=True),
                 "is not a user name", "claim 'preferred_username' is not a user name")


def test_admin_only_from_configured_users_and_groups() -> None:
    assert _who(DEFAULT, _claims(preferred_username="carol", groups=["users", "hpc-admins"])) == Viewer("carol", True)
    for groups in (["users"], "hpc-admins", ["hpc-admins-x"], [["hpc-admins"]], None):
        assert _who(DEFAULT, _claims(preferred_username="carol", groups=groups)) == Viewer("carol", False), groups
    # The groups claim is a setting: another claim's name, or none at all.
    roles = load_dashboard_settings(auth_mode="oidc", admin_groups="hpc-admins", oidc_groups_claim="roles")
    assert _who(roles, _claims(preferred_username="carol", roles=["hpc-admins"])) == Viewer("carol", True)
    assert _who(roles, _claims(preferred_username="carol", groups=["hpc-admins"])) == Viewer("carol", False)
    off = load_dashboard_settings(auth_mode="oidc", admin_groups="hpc-admins", oidc_groups_claim="")
    assert off.oidc_groups_claim is None
    assert _who(off, _claims(preferred_username="carol", groups=["hpc-admins"])) == Viewer("carol", False)
    # No admins configured: nobody is one, whatever the claims say.
    assert _who(load_dashboard_settings(auth_mode="oidc"), _claims(preferred_username="root", groups=["root"])) == \
        Viewer("root", False)


def test_oidc_settings_from_the_environment_and_bad_ones_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (DEFAULT.oidc_user_claim, DEFAULT.oidc_email_domains, DEFAULT.oidc_groups_claim) == \
        ("preferred_username", (), "groups")
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_OIDC_EMAIL_DOMAINS", " Site.EDU, hpc.example.org ,")
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_OIDC_USER_CLAIM", "uid")
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_OIDC_GROUPS_CLAIM", "roles")
    loaded = load_dashboard_settings()
    assert (loaded.oidc_user_claim, loaded.oidc_email_domains, loaded.oidc_groups_claim) == \
        ("uid", ("site.edu", "hpc.example.org"), "roles")
    for bad in ("@site.edu", "*.site.edu", "site.edu, alice@site.edu", ".site.edu", "site edu"):
        monkeypatch.setenv("JOBSIGHT_DASHBOARD_OIDC_EMAIL_DOMAINS", bad)
        with pytest.raises(SettingsError, match="JOBSIGHT_DASHBOARD_OIDC_EMAIL_DOMAINS: .*not a domain name"):
            load_dashboard_settings()
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_OIDC_EMAIL_DOMAINS", "site.edu")
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_OIDC_USER_CLAIM", "")
    with pytest.raises(SettingsError, match="JOBSIGHT_DASHBOARD_OIDC_USER_CLAIM"):
        load_dashboard_settings()


def _page(claims: dict[str, Any]) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.user = claims
    return at.run()


def test_the_page_refuses_an_unlisted_email_and_logs_it(monkeypatch: pytest.MonkeyPatch, dashboard_env: Seed,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_ADMIN_USERS", "root")
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_OIDC_EMAIL_DOMAINS", "site.edu")
    with caplog.at_level("WARNING", logger="jobsight.dashboard.identity"):
        at = _page(_claims(email="root@gmail.com", email_verified=True))
    assert not at.exception
    assert [error.value for error in at.error] == [
        "Sign-in refused: your login carries no 'preferred_username' claim, and its e-mail address is not in a "
        "domain this dashboard accepts. Log out and sign in with your site account, or ask the site's "
        "administrators."]
    assert [button.label for button in at.button] == ["Log out"]
    said = texts(at)
    assert "Signed in" not in said and not at.dataframe
    for leak in ("alice", "bob", dashboard_env.running):
        assert leak not in said, leak
    assert [r.getMessage() for r in caplog.records if r.name == "jobsight.dashboard.identity"] == [
        "refused OIDC sign-in without claim 'preferred_username': e-mail domain not in "
        "JOBSIGHT_DASHBOARD_OIDC_EMAIL_DOMAINS"]


def test_the_page_serves_a_listed_email_as_a_plain_user(monkeypatch: pytest.MonkeyPatch, dashboard_env: Seed) -> None:
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_ADMIN_USERS", "root")
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_OIDC_EMAIL_DOMAINS", "site.edu")
    at = _page(_claims(email="alice@site.edu", email_verified=True))
    assert not at.exception and "Signed in as **alice**" in texts(at) and "(admin)" not in texts(at)
    # root is an admin by name, but a name derived from root@site.edu is not: root's own (no) jobs only.
    at = _page(_claims(email="root@site.edu", email_verified=True))
    said = texts(at)
    assert not at.exception and "Signed in as **root**" in said and "(admin)" not in said
    for leak in ("alice", "bob", dashboard_env.running):
        assert leak not in said, leak
    # Named by the claim, root is the configured admin.
    at = _page(_claims(preferred_username="root", email="root@gmail.com", email_verified=False))
    assert not at.exception and "Signed in as **root** (admin)" in texts(at)
