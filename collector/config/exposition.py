"""Settings of the jobs' Prometheus exposition (``GET /metrics/jobs``, collector/api/routes/job_metrics.py):
``JOBSIGHT_EXPOSITION_*`` variables, then the ``[exposition]`` table of the ``JOBSIGHT_CONFIG`` file; a bad
value stops the collector with a message naming it.

```toml
[exposition]
max_series = 500000      # a scrape carries at most this many series; whole jobs past it are left out, counted
window_s = 120           # a GPU or rank silent longer than this has no series
energy_refresh_s = 60    # jobs' energy so far is read at most this often per process
allow_anonymous = false  # true: a scrape without a token is answered (a site that guards the port by network)
```
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, ValidationError
from pydantic_settings import SettingsConfigDict

from jobsight.collector.config.toml_settings import SettingsError, TomlTableSettings, validation_message


class ExpositionSettings(TomlTableSettings):
    model_config = SettingsConfigDict(env_prefix="JOBSIGHT_EXPOSITION_", extra="ignore")
    toml_table: ClassVar[str] = "exposition"

    max_series: int = Field(500_000, ge=1, le=50_000_000)
    """Series one scrape carries at most. Jobs go in whole, oldest first; a job that would pass the cap is
    left out, and its series are counted in ``jobsight_exposition_series_left_out_total``."""
    window_s: float = Field(120.0, gt=0, le=3600)
    """A GPU's latest sample, or a rank's latest step minute, older than this gives no series (the GPU
    or rank stopped reporting: Prometheus marks its series stale)."""
    energy_refresh_s: float = Field(60.0, ge=0, le=3600)
    """The running jobs' energy so far (GPU and node) is read at most this often per collector process
    and served from memory between reads (0: at every scrape)."""
    allow_anonymous: bool = False
    """Answer a scrape that brings no token (for a site that lets only its Prometheus reach the port).
    A job's or node's token is refused whatever this says: the exposition holds every user's jobs."""


def load_exposition_settings(**overrides: Any) -> ExpositionSettings:
    """Load and validate; raises :class:`SettingsError` naming the bad value."""
    try:
        return ExpositionSettings(**overrides)
    except ValidationError as exc:
        raise SettingsError(validation_message("exposition", "JOBSIGHT_EXPOSITION_", exc)) from None
