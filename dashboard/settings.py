"""Dashboard settings: one typed object from ``JOBSIGHT_DASHBOARD_*`` env vars and the
``[dashboard]`` table of the file named by ``JOBSIGHT_CONFIG`` (CONTRIBUTING rule 2).

The database comes from ``JOBSIGHT_DATABASE_URL``, the same variable the collector
reads; ``jobsight up`` sets it for the dashboard process.
"""

from __future__ import annotations

import functools
import ipaddress
import os
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from jobsight.collector.config.toml_settings import SettingsError, TomlTableSettings, validation_message

CommaList = Annotated[tuple[str, ...], NoDecode]
ProxyNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _comma_list(value: Any) -> Any:
    """An environment variable's ``a, b,c`` as its parts; a TOML list (or anything else) as it is."""
    return [part.strip() for part in value.split(",") if part.strip()] if isinstance(value, str) else value


class DashboardSettings(TomlTableSettings):
    model_config = SettingsConfigDict(env_prefix="JOBSIGHT_DASHBOARD_", extra="ignore")
    toml_table: ClassVar[str] = "dashboard"

    auth_mode: Literal["local", "header", "oidc"] = "local"
    """``local``: one user (``local``, an admin), allowed only while the server listens on
    loopback; ``header``: identity from a trusted reverse proxy's header; ``oidc``: Streamlit's
    ``st.login`` (an ``[auth]`` section in ``.streamlit/secrets.toml``)."""
    identity_header: str = "X-Forwarded-User"
    """Header the trusted proxy sets to the authenticated user name (header mode)."""
    groups_header: str | None = None
    """Header carrying the user's groups, comma separated; ``None`` means groups are not used."""
    trusted_proxies: Annotated[tuple[ProxyNetwork, ...], NoDecode] | None = None
    """Addresses and CIDRs (comma separated) of the proxies whose ``identity_header`` is believed
    (header mode); a request from any other peer is refused. ``None`` means loopback only
    (127.0.0.0/8 and ::1), and then header mode will not listen off loopback."""
    proxy_secret_header: str | None = None
    """Header the proxy adds with the secret of ``proxy_secret_file``, for a proxy whose address
    others share (another host, behind NAT); ``None`` means no secret is asked for."""
    proxy_secret_file: Path | None = None
    """File holding that secret (read whenever the settings load, surrounding whitespace ignored);
    set with ``proxy_secret_header`` or not at all."""
    admin_users: CommaList = ()
    admin_groups: CommaList = ()
    oidc_user_claim: str = Field("preferred_username", min_length=1)
    """OIDC mode: the ``st.user`` claim holding the cluster user name. Only when a login lacks it may
    the name come from the e-mail address, and only as ``oidc_email_domains`` allows."""
    oidc_email_domains: CommaList = ()
    """OIDC mode: domains (comma separated, exact, no sub-domains) whose addresses are cluster users'.
    A login without ``oidc_user_claim`` whose ``email_verified`` is true and whose address is in one
    of them is named by the address's local part; any other such login is refused. Empty (the
    default): the name never comes from an e-mail, as a provider that lets anyone sign up would
    hand out ``hpcadmin@...`` to whoever asks."""
    oidc_groups_claim: str | None = "groups"
    """OIDC mode: the claim listing the user's groups, matched against ``admin_groups``; ``None``
    (or empty) means groups are not used."""
    cluster: str | None = None
    """Show only this cluster; ``None`` shows every cluster in the database."""
    cache_ttl_s: int = Field(5, ge=1, le=3600)
    """How long query results are reused; running jobs refresh at this pace too."""
    refresh_s: int = Field(10, ge=2, le=3600)
    chart_points: int = Field(600, ge=50, le=2000)
    """Time buckets of a single series (about a chart's width in pixels): the most any one series
    gets, whatever the budgets below leave it."""
    heatmap_cells: int = Field(8000, ge=500, le=100_000)
    """Cells of the GPU heatmap (GPUs × time buckets): each GPU gets ``heatmap_cells // GPUs``
    buckets (see :func:`points_per_series`). The per-node GPU lines are drawn from the same buckets
    (the page reads GPUs once), and the step band is computed from a rank × bucket grid of the
    same size, so the two share a time resolution when there is a rank per GPU."""
    line_points: int = Field(4000, ge=500, le=50_000)
    """Points of one line chart across all its lines (a node's GPUs, the step chart's band and
    outlier ranks, a metric's ranks); neighbouring buckets are merged when a chart would exceed it."""
    low_util_percent: float = Field(30.0, ge=0, le=100)
    idle_util_percent: float = Field(5.0, ge=0, le=100)

    @field_validator("admin_users", "admin_groups", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        parts = _comma_list(value)
        return tuple(parts) if isinstance(value, str) else parts

    @field_validator("oidc_email_domains", mode="before")
    @classmethod
    def _domains(cls, value: Any) -> Any:
        parts = _comma_list(value)
        if not isinstance(parts, list | tuple):
            return value
        domains = []
        for part in parts:
            domain = str(part).strip().lower()
            # Exact names only: "@site.edu" or "*.site.edu" would read as a pattern, and a pattern
            # here decides who may claim a cluster user's name.
            if not domain or "@" in domain or "*" in domain or any(c.isspace() for c in domain) \
                    or domain.startswith(".") or domain.endswith("."):
                raise ValueError(f"not a domain name: {part!r} (write e.g. site.edu)")
            domains.append(domain)
        return tuple(domains)

    @field_validator("oidc_groups_claim", mode="before")
    @classmethod
    def _no_empty_claim(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _networks(cls, value: Any) -> Any:
        parts = _comma_list(value)
        if not isinstance(parts, list | tuple):
            return value
        try:
            # strict=False: "10.1.2.3/8" means the network 10.0.0.0/8, as proxy allow-lists write it
            return tuple(ipaddress.ip_network(str(part), strict=False) for part in parts)
        except ValueError as exc:
            raise ValueError(f"not an IP address or network: {exc}") from exc

    _proxy_secret: bytes | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _read_proxy_secret(self) -> Self:
        # SettingsError, not ValueError: pydantic passes it through untouched, so the message names
        # the variable rather than the model (and never quotes the file's content).
        if (self.proxy_secret_header is None) != (self.proxy_secret_file is None):
            raise SettingsError("JOBSIGHT_DASHBOARD_PROXY_SECRET_HEADER and JOBSIGHT_DASHBOARD_PROXY_SECRET_FILE go "
                                "together: set both or neither")
        if self.proxy_secret_file is not None:
            try:
                secret = self.proxy_secret_file.read_bytes().strip()
            except OSError as exc:
                raise SettingsError(f"JOBSIGHT_DASHBOARD_PROXY_SECRET_FILE: cannot read {self.proxy_secret_file}: "
                                    f"{exc.strerror}") from exc
            if not secret:
                raise SettingsError(f"JOBSIGHT_DASHBOARD_PROXY_SECRET_FILE: {self.proxy_secret_file} is empty")
            self._proxy_secret = secret
        return self

    @property
    def proxy_secret(self) -> bytes | None:
        """The proxy's shared secret; ``None`` when none is configured."""
        return self._proxy_secret


def load_dashboard_settings(**overrides: Any) -> DashboardSettings:
    """Load and validate settings; raises :class:`SettingsError` naming the bad value."""
    try:
        return DashboardSettings(**overrides)
    except ValidationError as exc:
        raise SettingsError(validation_message("dashboard", "JOBSIGHT_DASHBOARD_", exc)) from exc


def dashboard_settings() -> DashboardSettings:
    """The dashboard's settings, read once per process and shared by the app, every page and the data
    layer: Streamlit runs a page again on every interaction, and it no longer reads the TOML file each
    time. Read again only when the process's ``JOBSIGHT_*`` variables change (tests that run pages in
    one process with other settings); a bad value raises :class:`SettingsError` as the loader does."""
    return _settings_for(tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("JOBSIGHT_"))))


@functools.lru_cache(maxsize=8)
def _settings_for(environment: tuple[tuple[str, str], ...]) -> DashboardSettings:
    return load_dashboard_settings()
