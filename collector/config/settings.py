"""Collector settings: one typed object from ``JOBSIGHT_*`` env vars and a TOML file.

A bad value stops the server at start-up with a message naming it (STYLE rule 2).
The TOML file is named by ``JOBSIGHT_CONFIG``; its ``[collector]`` table holds the
same names as the fields below.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from jobsight.protocol.paths import ADMIN_TOKEN_FILE, default_data_dir

DEFAULT_MAX_GPUS_PER_JOB = 4096
DEFAULT_MAX_RANKS_PER_JOB = 65536
DEFAULT_MAX_OPEN_PROFILE_REQUESTS = 4


class SettingsError(RuntimeError):
    """A setting that cannot be used; the message names it."""


class TomlTableSource(PydanticBaseSettingsSource):
    """Reads one table (``[collector]``, ``[dashboard]``) of the file named by ``JOBSIGHT_CONFIG``."""

    def __init__(self, settings_cls: type[BaseSettings], table: str):
        super().__init__(settings_cls)
        self.table = table

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = os.environ.get("JOBSIGHT_CONFIG")
        if not path:
            return {}
        try:
            with open(path, "rb") as handle:
                data = tomllib.load(handle)
        except OSError as exc:
            raise SettingsError(f"JOBSIGHT_CONFIG: cannot read {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"JOBSIGHT_CONFIG: {path} is not valid TOML: {exc}") from exc
        section = data.get(self.table, {})
        return section if isinstance(section, dict) else {}


class TomlTableSettings(BaseSettings):
    """Settings from env vars, then the ``[toml_table]`` table of the ``JOBSIGHT_CONFIG`` file."""

    toml_table: ClassVar[str]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlTableSource(settings_cls, cls.toml_table))


def validation_message(component: str, env_prefix: str, exc: ValidationError) -> str:
    """One line naming every bad variable, for a component that must not start with them."""
    problems = "; ".join(
        f"{env_prefix}{'_'.join(str(p) for p in err['loc']).upper()}: {err['msg']}" for err in exc.errors()
    )
    return f"invalid {component} settings: {problems}"


class CollectorSettings(TomlTableSettings):
    model_config = SettingsConfigDict(env_prefix="JOBSIGHT_", extra="ignore")
    toml_table: ClassVar[str] = "collector"

    database_url: str | None = None
    """PostgreSQL DSN; ``None`` means ``jobsight up`` starts the embedded server."""
    host: str = "127.0.0.1"
    port: int = Field(8787, ge=1, le=65535)
    data_dir: Path = Field(default_factory=lambda: Path(default_data_dir()))
    admin_token_file: Path | None = None
    """``None`` means ``<data_dir>/admin_token``."""
    secret_file: Path | None = None
    """Cluster secret for job and node tokens; ``None`` means ``<data_dir>/cluster_secret``."""
    cluster: str = "default"
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0)
    """An ingest body must be smaller than this on the wire: one of this size or more is 413."""
    max_decompressed_bytes: int = Field(128 * 1024 * 1024, gt=0)
    """An ingest body must inflate to less than this: one reaching it is 413 (gzip bombs stop here)."""
    max_concurrent_decodes: int = Field(4, ge=1, le=64)
    """Ingest bodies inflated, parsed and validated at once (in worker threads), per collector
    process; more wait their turn, so a burst of large bodies holds at most this many inflated."""
    pool_size: int = Field(8, ge=1, le=256)
    keep_alive_s: int = Field(75, ge=1, le=3600)
    """How long an idle client connection is kept open. Longer than any agent's batch age (the
    node daemon's is 10 s): a shorter one made every node open a new TCP connection per batch,
    and accepting connections was an eighth of a loaded collector's CPU."""
    group_commit_wait_ms: float = Field(5.0, ge=0, le=1000)
    """How long the first batch of a group may wait for others on their way (only while other
    requests are being decoded); batches queued while a group is written join the next one."""
    group_commit_max_batches: int = Field(64, ge=1, le=10_000)
    """Batches written in one transaction, at most."""
    group_commit_max_records: int = Field(100_000, ge=1)
    """Records in one group, at most (a larger batch still goes, alone)."""
    group_commit_writers: int = Field(2, ge=1, le=16)
    """Threads writing groups per collector process, each on its own connection: while one
    waits for the database, the next group is written."""
    last_seen_flush_s: float = Field(5.0, gt=0, le=3600)
    """A job's ``last_seen`` is kept in memory and written this often (a row every node of a
    job shares is not written by every batch): it lags the records by about this much."""
    max_gpus_per_job: int = Field(DEFAULT_MAX_GPUS_PER_JOB, ge=1, le=32768)
    """The GPUs one job may claim: a record's ``gpu_index`` must be under it and a ``job_started``
    record may list at most this many ``gpus``; a record past it is refused (422 naming it)."""
    max_ranks_per_job: int = Field(DEFAULT_MAX_RANKS_PER_JOB, ge=1, le=2**31 - 1)
    """The ranks one job may have: a record's ``rank`` must be under it (422 naming the record)."""
    max_open_profile_requests: int = Field(DEFAULT_MAX_OPEN_PROFILE_REQUESTS, ge=1, le=1000)
    """Profile requests one job may have pending or running at once; one more is refused (429)."""
    retention_days: int = Field(180, ge=0)
    """Raw time-series partitions older than this are dropped; 0 keeps everything."""
    partitions_ahead_days: int = Field(2, ge=0, le=60)
    dashboard_url: str = "http://127.0.0.1:8501"
    dashboard_port: int = Field(8501, ge=1, le=65535)

    def resolved_admin_token_file(self) -> Path:
        return self.admin_token_file or self.data_dir / ADMIN_TOKEN_FILE

    def resolved_secret_file(self) -> Path:
        return self.secret_file or self.data_dir / "cluster_secret"


def load_collector_settings(**overrides: Any) -> CollectorSettings:
    """Load and validate settings; raises :class:`SettingsError` naming the bad value."""
    try:
        return CollectorSettings(**overrides)
    except ValidationError as exc:
        raise SettingsError(validation_message("collector", "JOBSIGHT_", exc)) from exc
