"""Who is looking, and what they may see.

Identity comes from exactly one place, chosen by ``auth_mode``:

- ``header``: a trusted reverse proxy (Open OnDemand, oauth2-proxy, ...) authenticates the
  user and sets ``identity_header``. The dashboard must be reachable only through that
  proxy, which must overwrite the header on every request.
- ``oidc``: Streamlit's own login (``st.login``), read back through ``st.user``.
- ``local``: one local user, an admin, allowed only while the server listens on loopback
  (what ``jobsight up`` does); on any other address the dashboard shows nothing.

A non-admin sees only jobs whose ``user_name`` is their name; admins see every job.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import streamlit as st

from jobsight.dashboard.settings import DashboardSettings

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
    """Why no one is signed in; ``login`` is true when a login button would help."""

    reason: str
    login: bool = False


def is_loopback(address: str | None) -> bool:
    """True only for an explicit loopback address: an empty address binds every interface."""
    if not address:
        return False
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def _is_admin(settings: DashboardSettings, name: str, groups: list[str]) -> bool:
    return name in settings.admin_users or any(group in settings.admin_groups for group in groups)


def resolve_viewer(
    settings: DashboardSettings,
    *,
    headers: Mapping[str, str],
    user: Mapping[str, Any] | None,
    server_address: str | None,
) -> Viewer | Refusal:
    """The viewer for one session from what the request carries; pure, so it is tested directly."""
    if settings.auth_mode == "local":
        if not is_loopback(server_address):
            return Refusal(
                f"Local mode (no login) is allowed only when the dashboard listens on loopback, but it listens "
                f"on {server_address or 'every interface'!r}. Set JOBSIGHT_DASHBOARD_AUTH_MODE=header or oidc."
            )
        return Viewer(LOCAL_USER, is_admin=True)
    if settings.auth_mode == "header":
        lowered = {key.lower(): value for key, value in headers.items()}
        name = (lowered.get(settings.identity_header.lower()) or "").strip()
        if not name:
            return Refusal(f"The request carries no {settings.identity_header} header: open the dashboard "
                           "through the site's login proxy.")
        groups: list[str] = []
        if settings.groups_header:
            groups = [g.strip() for g in (lowered.get(settings.groups_header.lower()) or "").split(",") if g.strip()]
        return Viewer(name, _is_admin(settings, name, groups))
    if not user or not user.get("is_logged_in"):
        return Refusal("Please log in.", login=True)
    claim = user.get(settings.oidc_user_claim)
    email = user.get("email")
    name = str(claim) if claim else (str(email).split("@", 1)[0] if email else "")
    if not name:
        return Refusal(f"The login provider sent neither {settings.oidc_user_claim!r} nor an e-mail address.")
    raw_groups = user.get("groups") or []
    groups = [str(g) for g in raw_groups] if isinstance(raw_groups, list) else []
    return Viewer(name, _is_admin(settings, name, groups))


def current_viewer(settings: DashboardSettings) -> Viewer | Refusal:
    """The viewer of this Streamlit session."""
    headers: Mapping[str, str] = {}
    user: Mapping[str, Any] | None = None
    if settings.auth_mode == "header":
        headers = st.context.headers.to_dict()
    elif settings.auth_mode == "oidc":
        user = st.user.to_dict()
    return resolve_viewer(settings, headers=headers, user=user, server_address=st.get_option("server.address"))


def viewer_or_stop(settings: DashboardSettings) -> Viewer:
    """The session's viewer; otherwise says why there is none, offers a login, and stops the page."""
    found = current_viewer(settings)
    if isinstance(found, Viewer):
        return found
    st.warning(found.reason)
    if found.login:
        st.button("Log in", on_click=st.login, type="primary")
    st.stop()
    raise AssertionError("st.stop() returned")  # st.stop raises; this keeps the type checker honest
