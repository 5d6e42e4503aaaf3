"""Who is looking, and what they may see.

Identity comes from exactly one place, chosen by ``auth_mode``:

- ``header``: a trusted reverse proxy (Open OnDemand, oauth2-proxy, ...) authenticates the
  user and sets ``identity_header``, overwriting any the browser sent. The header counts only
  on a connection from one of ``trusted_proxies`` (and with the proxy's shared secret, when
  one is configured); anyone else gets a refusal page (:mod:`jobsight.dashboard.proxy_trust`).
- ``oidc``: Streamlit's own login (``st.login``), read back through ``st.user``. The name is the
  ``oidc_user_claim`` claim; without it, the local part of a verified address in one of
  ``oidc_email_domains`` (none by default), else the login is refused (:func:`_oidc_viewer`).
- ``local``: one local user, an admin, allowed only while the server listens on loopback
  (what ``jobsight up`` does); on any other address the dashboard shows nothing.

A non-admin sees only jobs whose ``user_name`` is their name; admins see every job.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import streamlit as st

from jobsight.dashboard.proxy_trust import (
    NO_FORWARDED_FOR,
    bind_problem,
    is_loopback,
    peer_is_trusted,
    secret_matches,
    trusted_networks,
)
from jobsight.dashboard.settings import DashboardSettings

log = logging.getLogger("jobsight.dashboard.identity")

LOCAL_USER = "local"


@dataclass(frozen=True)
class Viewer:
    name: str
    is_admin: bool

    def may_see(self, job: Mapping[str, Any]) -> bool:
        return self.is_admin or (job.get("user_name") is not None and job.get("user_name") == self.name)

    def user_filter(self) -> str | None:
        """The ``user_name`` every job query must be limited to; ``None`` means all users."""
        return None if self.is_admin else self.name


@dataclass(frozen=True)
class Refusal:
    """Why no one is signed in; ``login`` is true when a login button would help. ``logged`` is
    the line for the server's log when the request was turned away as untrusted (never a header's
    value); ``None`` means nothing worth logging happened."""

    reason: str
    login: bool = False
    logged: str | None = None
    logout: bool = False
    """True when someone is signed in but refused: a log-out button lets them try another account."""


def _is_admin(settings: DashboardSettings, name: str, groups: list[str]) -> bool:
    return name in settings.admin_users or any(group in settings.admin_groups for group in groups)


def resolve_viewer(
    settings: DashboardSettings,
    *,
    headers: Mapping[str, str],
    user: Mapping[str, Any] | None,
    server_address: str | None,
    peer: str | None,
    peer_is_real: bool,
) -> Viewer | Refusal:
    """The viewer for one session from what the request carries; pure, so it is tested directly.
    ``peer`` is the connection's peer address as ``st.context.ip_address`` gives it (``None`` for
    loopback); ``peer_is_real`` is false when the server may have replaced it with a client-sent
    ``X-Forwarded-For``."""
    if settings.auth_mode == "local":
        if not is_loopback(server_address):
            return Refusal(
                f"Local mode (no login) is allowed only when the dashboard listens on loopback, but it listens "
                f"on {server_address or 'every interface'!r}. Set JOBSIGHT_DASHBOARD_AUTH_MODE=header or oidc."
            )
        return Viewer(LOCAL_USER, is_admin=True)
    if settings.auth_mode == "header":
        untrusted = _untrusted(settings, headers, server_address, peer, peer_is_real)
        if untrusted is not None:
            return untrusted
        lowered = {key.lower(): value for key, value in headers.items()}
        name = (lowered.get(settings.identity_header.lower()) or "").strip()
        if not name:
            return Refusal(f"The request carries no {settings.identity_header} header: open the dashboard "
                           "through the site's login proxy.")
        groups: list[str] = []
        if settings.groups_header:
            groups = [g.strip() for g in (lowered.get(settings.groups_header.lower()) or "").split(",") if g.strip()]
        return Viewer(name, _is_admin(settings, name, groups))
    return _oidc_viewer(settings, user)


# A cluster user name as an e-mail's local part may give it: no "+tag", quotes or "@" that a
# cluster account could not have, so nothing odd is ever compared with a job's user_name.
_LOCAL_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def _oidc_viewer(settings: DashboardSettings, user: Mapping[str, Any] | None) -> Viewer | Refusal:
    """OIDC mode's viewer from ``st.user`` as a mapping (Streamlit's cookie: the ID token's claims
    plus ``is_logged_in``). The provider's configuration is trusted, its users are not: where it
    accepts any account, anyone can log in with any e-mail local part (``hpcadmin@gmail.com``), so an
    address names a user only when it is verified and in a domain the site listed, and a name
    derived from it is never an admin by ``admin_users``."""
    if not user or not user.get("is_logged_in"):
        return Refusal("Please log in.", login=True)
    claim = settings.oidc_user_claim
    groups = _oidc_groups(settings, user)
    in_admin_group = any(group in settings.admin_groups for group in groups)
    value = user.get(claim)
    if value is not None and value != "":
        if not isinstance(value, str) or not value.strip():
            return Refusal(f"Sign-in refused: the login provider's {claim!r} claim is not a user name. "
                           "Ask the site's administrators.", logout=True,
                           logged=f"refused OIDC sign-in: claim {claim!r} is not a user name")
        name = value.strip()
        return Viewer(name, name in settings.admin_users or in_admin_group)
    refused = _email_problem(settings, user)
    if refused is not None:
        return Refusal(f"Sign-in refused: your login carries no {claim!r} claim, {refused[0]}. Log out and sign "
                       "in with your site account, or ask the site's administrators.", logout=True,
                       logged=f"refused OIDC sign-in without claim {claim!r}: {refused[1]}")
    email = str(user["email"])
    # Admin by the verified address itself, listed in admin_users, or by group; never by the derived name.
    listed = email.casefold() in {entry.casefold() for entry in settings.admin_users if "@" in entry}
    return Viewer(email.rsplit("@", 1)[0], listed or in_admin_group)


def _email_problem(settings: DashboardSettings, user: Mapping[str, Any]) -> tuple[str, str] | None:
    """Why the login's e-mail may not name the user, as (what the page says, what the log says; never
    the address); ``None`` when it may."""
    if not settings.oidc_email_domains:
        return ("and this dashboard takes names only from that claim",
                "JOBSIGHT_DASHBOARD_OIDC_EMAIL_DOMAINS is empty")
    email = user.get("email")
    if not isinstance(email, str) or email.count("@") != 1:
        return "and no usable e-mail address", "no single e-mail address"
    # `is True`: the claim is a JSON boolean; a string "true" or any other value is not a verification.
    if user.get("email_verified") is not True:
        return "and its e-mail address is not verified", "email_verified is not true"
    local, domain = email.rsplit("@", 1)
    if domain.lower() not in settings.oidc_email_domains:
        return ("and its e-mail address is not in a domain this dashboard accepts",
                "e-mail domain not in JOBSIGHT_DASHBOARD_OIDC_EMAIL_DOMAINS")
    if not _LOCAL_PART.fullmatch(local):
        return ("and its e-mail address does not name a cluster user", "e-mail local part is not a user name")
    return None


def _oidc_groups(settings: DashboardSettings, user: Mapping[str, Any]) -> list[str]:
    """The groups claim's strings; anything but a list of strings counts as no groups."""
    if settings.oidc_groups_claim is None:
        return []
    raw = user.get(settings.oidc_groups_claim)
    return [g for g in raw if isinstance(g, str)] if isinstance(raw, list) else []


def _untrusted(settings: DashboardSettings, headers: Mapping[str, str], server_address: str | None,
               peer: str | None, peer_is_real: bool) -> Refusal | None:
    """Header mode's refusal of a connection whose header cannot be believed; ``None`` when it can."""
    problem = bind_problem(settings, server_address)
    if problem is not None:
        return Refusal(f"This dashboard refuses to serve: {problem}.", logged=f"refused to serve: {problem}")
    if not peer_is_real:
        variable, value = NO_FORWARDED_FOR
        return Refusal("This dashboard refuses to serve: start it with `jobsight dashboard`, which keeps Streamlit "
                       "from taking the client's address from X-Forwarded-For.",
                       logged=f"refused to serve: header mode needs {variable}={value!r} in Streamlit's environment")
    where, source = ("this host (loopback)", "loopback") if peer is None else (peer, peer)
    if not peer_is_trusted(peer, trusted_networks(settings)):
        return Refusal(f"Sign-in refused: this connection comes from {where}, not from the site's login proxy. "
                       "Open the dashboard through the proxy's address.",
                       logged=f"refused {settings.identity_header} from {source}: not one of trusted_proxies")
    secret = settings.proxy_secret
    if secret is not None and settings.proxy_secret_header is not None:
        lowered = {key.lower(): value for key, value in headers.items()}
        if not secret_matches(lowered.get(settings.proxy_secret_header.lower()), secret):
            return Refusal("Sign-in refused: the request did not come through the site's login proxy.",
                           logged=f"refused {settings.identity_header} from {source}: "
                                  f"{settings.proxy_secret_header} missing or wrong")
    return None


def current_viewer(settings: DashboardSettings) -> Viewer | Refusal:
    """The viewer of this Streamlit session."""
    headers: Mapping[str, str] = {}
    user: Mapping[str, Any] | None = None
    peer: str | None = None
    if settings.auth_mode == "header":
        headers = st.context.headers.to_dict()
        peer = st.context.ip_address
    elif settings.auth_mode == "oidc":
        user = st.user.to_dict()
    variable, value = NO_FORWARDED_FOR
    return resolve_viewer(settings, headers=headers, user=user, server_address=st.get_option("server.address"),
                          peer=peer, peer_is_real=os.environ.get(variable) == value)


_LOGGED = "_jobsight_refusal_logged"


def viewer_or_stop(settings: DashboardSettings) -> Viewer:
    """The session's viewer; otherwise says why there is none, offers a login, and stops the page."""
    found = current_viewer(settings)
    if isinstance(found, Viewer):
        return found
    if found.logged is not None:
        # Once per session: the app and its page both ask, and a refused browser may keep reloading.
        if st.session_state.get(_LOGGED) != found.logged:
            st.session_state[_LOGGED] = found.logged
            log.warning("%s", found.logged)
        st.error(found.reason)  # our words and the site's settings, never a user's
        if found.logout:
            st.button("Log out", on_click=st.logout)
        st.stop()
    st.warning(found.reason)
    if found.login:
        st.button("Log in", on_click=st.login, type="primary")
    st.stop()
    raise AssertionError("st.stop() returned")  # st.stop raises; this keeps the type checker honest
