"""Whom header mode believes: the rules on the connection's peer, the proxy's shared secret and
the listen address, without Streamlit, so the command line checks them before Streamlit starts.

The identity header is only as good as the proxy that sets it: anyone who reaches the dashboard's
port directly can send any name. So the header counts only on a connection whose peer is one of
``trusted_proxies`` (by default loopback only), and, with a shared secret configured, only when
the proxy's secret header matches too.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable

from jobsight.dashboard.settings import DashboardSettings, ProxyNetwork

LOOPBACK: tuple[ProxyNetwork, ...] = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
"""Who is trusted while ``trusted_proxies`` is unset: a proxy on the dashboard's own host."""

NO_FORWARDED_FOR = ("FORWARDED_ALLOW_IPS", "")
"""The environment variable (and value) that stops uvicorn, Streamlit's server, from replacing the
peer address with one taken from ``X-Forwarded-For``: by default it believes that header from
127.0.0.1, so any local user could claim to be a trusted proxy, and a local proxy's own
``X-Forwarded-For`` would turn every proxied request into the browser's address. ``jobsight
dashboard`` and ``jobsight up`` start Streamlit with it; header mode refuses to serve without it."""


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


def trusted_networks(settings: DashboardSettings) -> tuple[ProxyNetwork, ...]:
    return LOOPBACK if settings.trusted_proxies is None else settings.trusted_proxies


def peer_is_trusted(peer: str | None, networks: Iterable[ProxyNetwork]) -> bool:
    """Whether the connection's peer is a trusted proxy. ``None`` is what Streamlit's
    ``st.context.ip_address`` reports for a loopback peer (127.0.0.1 or ::1): it counts as trusted
    when the networks hold either."""
    if peer is None:
        candidates = [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")]
    else:
        try:
            address = ipaddress.ip_address(peer.strip("[]"))
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped  # a dual-stack socket reports IPv4 peers as ::ffff:a.b.c.d
        candidates = [address]
    return any(address.version == network.version and address in network
               for network in networks for address in candidates)


def secret_matches(sent: str | None, secret: bytes) -> bool:
    """Whether the proxy's secret header carries ``secret``, compared in constant time."""
    return sent is not None and hmac.compare_digest(sent.strip().encode(), secret)


def bind_problem(settings: DashboardSettings, address: str | None) -> str | None:
    """Why the dashboard must not listen on ``address`` (``None``: every interface) with these
    settings, in one line; ``None`` when it may. Header mode off loopback needs ``trusted_proxies``
    set on purpose: the loopback default would let anyone on the host in, and nothing else would
    keep a direct client out."""
    if settings.auth_mode != "header" or is_loopback(address) or settings.trusted_proxies is not None:
        return None
    return (f"header mode would take {settings.identity_header} from anyone who reaches "
            f"{address or 'every interface'}: set JOBSIGHT_DASHBOARD_TRUSTED_PROXIES (trusted_proxies in "
            "[dashboard]) to the proxy's addresses, or listen on 127.0.0.1 behind a local proxy")
