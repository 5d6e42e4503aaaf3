"""Settings of the simulated cluster of ``jobsight up --demo``: ``JOBSIGHT_DEMO_*`` and ``[demo]``.

The defaults tell the story at a pace a person watches: the live job has been running for 16
minutes when ``jobsight up`` starts (its past is written at once, so the first look already shows
the healthy part and the straggling rank), hangs a minute later, and stays hung until its hour's
time limit; then the next run starts. A test shortens every part (see
``tests/dashboard/test_demo_browser.py``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import SettingsConfigDict

from jobsight.collector.config.toml_settings import SettingsError, TomlTableSettings, validation_message
from jobsight.commands.demo_story import Timings


class DemoSettings(TomlTableSettings):
    model_config = SettingsConfigDict(env_prefix="JOBSIGHT_DEMO_", extra="ignore")
    toml_table: ClassVar[str] = "demo"

    healthy_s: float = Field(600.0, gt=0, le=86_400)
    """How long the simulated job trains healthily before one rank falls behind."""
    straggler_s: float = Field(420.0, gt=0, le=86_400)
    """How long that rank straggles before it hangs."""
    time_limit_s: float = Field(3600.0, gt=0, le=7 * 86_400)
    """The job's time limit: it stays hung until then, ends as ``timeout``, and the next run starts."""
    headstart_s: float = Field(960.0, ge=0, le=6 * 86_400)
    """How long the first run has been going when ``jobsight up`` starts: its past is written at once."""
    step_s: float = Field(0.5, ge=0.05, le=60)
    """A healthy training step, in seconds."""
    sample_interval_s: float = Field(1.0, ge=0.2, le=60)
    """How often the simulated GPUs are read (1 Hz, as a node daemon set to sample every second)."""
    restart_after_s: float = Field(30.0, ge=0, le=86_400)
    """Pause between a run's end and the next run's start."""
    history_days: int = Field(30, ge=0, le=180)
    """Days of finished simulated jobs written once for the audit pages and trends."""
    seed: int = 0
    """Seed of every random choice of the simulation, so a run can be repeated."""

    @model_validator(mode="after")
    def _fits(self) -> Self:
        if self.healthy_s + self.straggler_s >= self.time_limit_s:
            raise ValueError("time_limit_s must be longer than healthy_s + straggler_s")
        if self.headstart_s >= self.time_limit_s:
            raise ValueError("headstart_s must be shorter than time_limit_s")
        return self

    def timings(self) -> Timings:
        return Timings(self.healthy_s, self.straggler_s, self.time_limit_s, self.step_s)


def load_demo_settings(**overrides: Any) -> DemoSettings:
    """Load and validate; raises :class:`SettingsError` naming the bad value."""
    try:
        return DemoSettings(**overrides)
    except ValidationError as exc:
        raise SettingsError(validation_message("demo", "JOBSIGHT_DEMO_", exc)) from exc
