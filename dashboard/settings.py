"""Dashboard settings: one typed object from ``JOBSIGHT_DASHBOARD_*`` env vars and the
``[dashboard]`` table of the file named by ``JOBSIGHT_CONFIG`` (STYLE rule 2).

The database comes from ``JOBSIGHT_DATABASE_URL``, the same variable the collector
reads; ``jobsight up`` sets it for the dashboard process.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from jobsight.collector.settings import SettingsError, TomlTableSettings, validation_message

CommaList = Annotated[tuple[str, ...], NoDecode]


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
    admin_users: CommaList = ()
    admin_groups: CommaList = ()
    oidc_user_claim: str = "preferred_username"
    """``st.user`` claim holding the cluster user name; falls back to the e-mail's local part."""
    cluster: str | None = None
    """Show only this cluster; ``None`` shows every cluster in the database."""
    cache_ttl_s: int = Field(5, ge=1, le=3600)
    """How long query results are reused; running jobs refresh at this pace too."""
    refresh_s: int = Field(10, ge=2, le=3600)
    chart_points: int = Field(600, ge=50, le=2000)
    """Buckets per series: about a chart's width in pixels."""
    low_util_percent: float = Field(30.0, ge=0, le=100)
    idle_util_percent: float = Field(5.0, ge=0, le=100)

    @field_validator("admin_users", "admin_groups", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value



def load_dashboard_settings(**overrides: Any) -> DashboardSettings:
    """Load and validate settings; raises :class:`SettingsError` naming the bad value."""
    try:
        return DashboardSettings(**overrides)
    except ValidationError as exc:
        raise SettingsError(validation_message("dashboard", "JOBSIGHT_DASHBOARD_", exc)) from exc
