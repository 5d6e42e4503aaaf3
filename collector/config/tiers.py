"""Settings of the storage tiers, read like the collector's own (``JOBSIGHT_*`` variables, then
the ``[collector]`` table of the ``JOBSIGHT_CONFIG`` file); a bad value stops the collector (or
``jobsight compact``) with a message naming it.

* ``JOBSIGHT_HOT_MINUTES`` (15): GPU and host samples stay one row per sample until their UTC
  hour has been over this long (time for the late rows of an hour to come in: a node daemon's
  batches are seconds old, a spool replayed after an outage is the exception the pass merges
  later); then the compaction pass packs the hour (0: as soon as it ends). The live page reads
  the raw rows of the newest minutes and the packed blocks of everything older.
* ``JOBSIGHT_COMPACT_INTERVAL_S`` (300): how often each collector process tries a pass (one
  runs at a time); 0 turns the timer off (``jobsight compact`` still works). An hour is packed
  between ``HOT_MINUTES`` and ``HOT_MINUTES`` + this after it ends.
* ``JOBSIGHT_HOT_DAYS`` is gone (days were the unit before hours): set, it stops the collector
  with a message naming its successor rather than being ignored.
* ``JOBSIGHT_PACKED_RETENTION_DAYS`` (``JOBSIGHT_RETENTION_DAYS``): packed partitions older than
  this are dropped (0 keeps them).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import SettingsConfigDict

from jobsight.collector.config.toml_settings import SettingsError, TomlTableSettings, validation_message


class TierSettings(TomlTableSettings):
    model_config = SettingsConfigDict(env_prefix="JOBSIGHT_", extra="ignore")
    toml_table: ClassVar[str] = "collector"

    hot_minutes: int = Field(15, ge=0, le=7 * 24 * 60)
    """Minutes a closed UTC hour of samples stays row per sample before it is packed (the wire
    refuses records older than 7 days: a longer wait would keep nothing more)."""
    hot_days: int | None = None
    """The setting hours replaced; only read to refuse it."""
    compact_interval_s: float = Field(300.0, ge=0, le=7 * 86400)
    """Seconds between compaction passes of one collector process; 0: no timer."""
    packed_retention_days: int | None = Field(None, ge=0)
    """Packed partitions older than this are dropped; ``None``: ``JOBSIGHT_RETENTION_DAYS``."""

    @field_validator("hot_days")
    @classmethod
    def _hot_days_is_gone(cls, value: int | None) -> int | None:
        if value is not None:
            raise ValueError("hours are packed now, not days: set JOBSIGHT_HOT_MINUTES (minutes after an hour "
                             "ends, default 15) instead of JOBSIGHT_HOT_DAYS")
        return value

    def older_than(self) -> dt.timedelta:
        """How long after its end an hour is packed by the timer's passes."""
        return dt.timedelta(minutes=self.hot_minutes)

    def packed_retention(self, retention_days: int) -> int:
        """The packed tier's retention in days, given the collector's ``retention_days``."""
        return retention_days if self.packed_retention_days is None else self.packed_retention_days


def load_tier_settings(**overrides: Any) -> TierSettings:
    """Load and validate; raises :class:`SettingsError` naming the bad value."""
    try:
        return TierSettings(**overrides)
    except ValidationError as exc:
        raise SettingsError(validation_message("collector", "JOBSIGHT_", exc)) from exc
