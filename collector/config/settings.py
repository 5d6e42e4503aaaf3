"""The collector's settings: one typed object, loaded once when a process starts and passed in.

Its own fields come from ``JOBSIGHT_*`` env vars and the ``[collector]`` table of the file named by
``JOBSIGHT_CONFIG``; each room's section keeps its own variables and table:

* ``tiers`` (:mod:`jobsight.collector.config.tiers`): ``JOBSIGHT_HOT_MINUTES``, ``JOBSIGHT_COMPACT_*``…
  in ``[collector]``;
* ``health`` (:mod:`jobsight.collector.config.health`): ``JOBSIGHT_HEALTH_*``, ``[health]``;
* ``alerts`` (:mod:`jobsight.collector.config.alerts`): ``JOBSIGHT_ALERTS_*``, ``[alerts]``;
* ``reconcile`` (:mod:`jobsight.collector.config.reconcile`): ``JOBSIGHT_RECONCILE_*``, ``[reconcile]``;
* ``actions`` (:mod:`jobsight.collector.config.actions`): ``JOBSIGHT_ACTIONS_*``, ``[actions]``;
* ``notices`` (:mod:`jobsight.collector.config.notices`): ``JOBSIGHT_NOTICES_*``, ``[notices]``;
* ``carbon`` (:mod:`jobsight.collector.config.carbon`): ``JOBSIGHT_CARBON_*``, ``[carbon]``;
* ``exposition`` (:mod:`jobsight.collector.config.exposition`): ``JOBSIGHT_EXPOSITION_*``, ``[exposition]``.

:func:`load_collector_settings` reads all of them before anything starts, and a bad value anywhere
stops the start with one message naming every bad value (CONTRIBUTING rule 2).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, Field, ValidationError
from pydantic_settings import SettingsConfigDict

from jobsight.collector.config.actions import ActionSettings, load_action_settings
from jobsight.collector.config.alerts import AlertSettings, load_alert_settings
from jobsight.collector.config.carbon import CarbonSettings, load_carbon_settings
from jobsight.collector.config.exposition import ExpositionSettings, load_exposition_settings
from jobsight.collector.config.health import HealthSettings, load_health_settings
from jobsight.collector.config.notices import NoticeSettings, load_notice_settings
from jobsight.collector.config.reconcile import ReconcileSettings, load_reconcile_settings
from jobsight.collector.config.tiers import TierSettings, load_tier_settings
from jobsight.collector.config.toml_settings import SettingsError, TomlTableSettings, validation_message
from jobsight.protocol.paths import ADMIN_TOKEN_FILE, default_data_dir

__all__ = ["DEFAULT_MAX_GPUS_PER_JOB", "DEFAULT_MAX_OPEN_PROFILE_REQUESTS", "DEFAULT_MAX_RANKS_PER_JOB",
           "CollectorSettings", "SettingsError", "load_collector_settings"]

DEFAULT_MAX_GPUS_PER_JOB = 4096
DEFAULT_MAX_RANKS_PER_JOB = 65536
DEFAULT_MAX_OPEN_PROFILE_REQUESTS = 4


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
    """Database connections for ingest (group commit, partition DDL, allocation look-ups) per collector
    process; reads have their own (``read_pool_size``), so no read can hold the ones ingest needs."""
    read_pool_size: int = Field(8, ge=1, le=256)
    """Database connections for the read routes per collector process; a read waiting past 5 s for
    one is answered 503 with ``Retry-After``, and ingest is not slowed by it."""
    read_statement_timeout_s: float = Field(30.0, gt=0, le=3600)
    """A read's statement is cancelled after this long (PostgreSQL's ``statement_timeout`` on the read
    connections) and answered 503 naming the timeout: no read, however large the job, runs for longer."""
    heavy_reads: int = Field(2, ge=1, le=64)
    """Heavy reads (a job's epochs) one collector process works on at once, each in a worker process of
    its own (started on first use, one read connection each); more wait up to 5 s for a turn, then are
    answered 503."""
    heavy_read_niceness: int = Field(10, ge=0, le=19)
    """How much the heavy-read workers' ``nice`` is raised: the kernel gives the process that answers
    ingest the CPU before them (0: the same priority)."""
    max_epochs_per_read: int = Field(1000, ge=1, le=1_000_000)
    """Epochs one ``GET /v1/jobs/{job}/epochs`` answers at most (the job's records set how many it
    has); the answer says how many were left out."""
    summary_refresh_interval_s: float = Field(60.0, gt=0, le=86400)
    """An ended job's summary is recomputed when its ``job_ended`` is stored; rows that arrive later
    mark it, and the refresh pass recomputes marked summaries this often (at most once per interval)."""
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

    # The sections, each from its own variables and table (their names stay as they were); given
    # by load_collector_settings, which reads them all before anything starts.
    tiers: TierSettings = Field(default_factory=load_tier_settings)
    health: HealthSettings = Field(default_factory=load_health_settings)
    alerts: AlertSettings = Field(default_factory=load_alert_settings)
    reconcile: ReconcileSettings = Field(default_factory=load_reconcile_settings)
    actions: ActionSettings = Field(default_factory=load_action_settings)
    notices: NoticeSettings = Field(default_factory=load_notice_settings)
    carbon: CarbonSettings = Field(default_factory=load_carbon_settings)
    exposition: ExpositionSettings = Field(default_factory=load_exposition_settings)

    def resolved_admin_token_file(self) -> Path:
        return self.admin_token_file or self.data_dir / ADMIN_TOKEN_FILE

    def resolved_secret_file(self) -> Path:
        return self.secret_file or self.data_dir / "cluster_secret"


SECTIONS: dict[str, tuple[type[BaseModel], Callable[[], BaseModel]]] = {
    "tiers": (TierSettings, load_tier_settings),
    "health": (HealthSettings, load_health_settings),
    "alerts": (AlertSettings, load_alert_settings),
    "reconcile": (ReconcileSettings, load_reconcile_settings),
    "actions": (ActionSettings, load_action_settings),
    "notices": (NoticeSettings, load_notice_settings),
    "carbon": (CarbonSettings, load_carbon_settings),
    "exposition": (ExpositionSettings, load_exposition_settings),
}
"""Each section of :class:`CollectorSettings`, its type and how it is read."""


def load_collector_settings(**overrides: Any) -> CollectorSettings:
    """Load and validate the settings and every section; raises :class:`SettingsError` naming every
    bad value at once (never an alert sink's URL: none of these messages quotes an input)."""
    problems: list[str] = []
    sections: dict[str, Any] = {}
    for name, (section, load) in SECTIONS.items():
        if name not in overrides:
            try:
                sections[name] = load()
            except SettingsError as exc:
                problems.append(str(exc))
                # A stand-in (defaults, nothing read), so the collector's own fields are still checked.
                sections[name] = section.model_construct()
    settings: CollectorSettings | None = None
    try:
        settings = CollectorSettings(**sections, **overrides)
    except ValidationError as exc:
        problems.insert(0, validation_message("collector", "JOBSIGHT_", exc))
    except SettingsError as exc:  # the TOML file is unreadable: every section has said so too
        problems.insert(0, str(exc))
    if problems or settings is None:
        raise SettingsError("; ".join(dict.fromkeys(problems)))
    return settings
