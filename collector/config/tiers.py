"""Settings of the storage tiers, read like the collector's own (``JOBSIGHT_*`` variables, then
the ``[collector]`` table of the ``JOBSIGHT_CONFIG`` file); a bad value stops the collector (or
``jobsight compact``) with a message naming it.

* ``JOBSIGHT_HOT_DAYS`` (1): GPU samples stay one row per sample for at least this many days
  after their UTC day ends; then the compaction pass packs the day (0: as soon as it ends).
* ``JOBSIGHT_COMPACT_INTERVAL_S`` (3600): how often each collector process tries a pass (one
  runs at a time); 0 turns the timer off (``jobsight compact`` still works).
* ``JOBSIGHT_PACKED_RETENTION_DAYS`` (``JOBSIGHT_RETENTION_DAYS``): packed partitions older than
  this are dropped (0 keeps them).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from pydantic import Field, ValidationError
from pydantic_settings import SettingsConfigDict

from jobsight.collector.config.toml_settings import SettingsError, TomlTableSettings, validation_message


class TierSettings(TomlTableSettings):
    model_config = SettingsConfigDict(env_prefix="JOBSIGHT_", extra="ignore")
    toml_table: ClassVar[str] = "collector"

    hot_days: int = Field(1, ge=0, le=3650)
    """Days a closed day of GPU samples stays row per sample before it is packed."""
    compact_interval_s: float = Field(3600.0, ge=0, le=7 * 86400)
    """Seconds between compaction passes of one collector process; 0: no timer."""
    packed_retention_days: int | None = Field(None, ge=0)
    """Packed partitions older than this are dropped; ``None``: ``JOBSIGHT_RETENTION_DAYS``."""

    def older_than(self) -> dt.timedelta:
        """How long after its end a day is packed by the timer's passes."""
        return dt.timedelta(days=self.hot_days)

    def packed_retention(self, retention_days: int) -> int:
        """The packed tier's retention in days, given the collector's ``retention_days``."""
        return retention_days if self.packed_retention_days is None else self.packed_retention_days


def load_tier_settings(**overrides: Any) -> TierSettings:
    """Load and validate; raises :class:`SettingsError` naming the bad value."""
    try:
        return TierSettings(**overrides)
    except ValidationError as exc:
        raise SettingsError(validation_message("collector", "JOBSIGHT_", exc)) from exc
