"""Settings of the health evaluator (``collector/passes/findings.py``): ``JOBSIGHT_HEALTH_*`` variables,
then the ``[health]`` table of the ``JOBSIGHT_CONFIG`` file. Each rule's thresholds are here with
the defaults of :class:`jobsight.rules.health.HealthThresholds`; a bad value stops the
collector with a message naming it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import SettingsConfigDict

from jobsight.collector.config.toml_settings import SettingsError, TomlTableSettings, validation_message
from jobsight.rules.health import HealthThresholds
from jobsight.rules.rule_names import RULES

_D = HealthThresholds()


class HealthSettings(TomlTableSettings):
    model_config = SettingsConfigDict(env_prefix="JOBSIGHT_HEALTH_", extra="ignore")
    toml_table: ClassVar[str] = "health"

    interval_s: float = Field(60.0, ge=0, le=86400)
    """Seconds between evaluations of the running jobs; 0 turns the evaluator off."""
    rules: list[str] = Field(default_factory=lambda: list(RULES))
    """The rules evaluated (all by default)."""
    gone_after_s: float = Field(86400.0, gt=0)
    """A running job that sent nothing for this long is not called hung: it is gone without an end."""
    hung_factor: float = Field(_D.hung_factor, gt=1)
    hung_min_s: float = Field(_D.hung_min_s, ge=0)
    straggler_window_s: float = Field(_D.straggler_window_s, gt=0)
    straggler_ratio: float = Field(_D.straggler_ratio, gt=1)
    straggler_min_s: float = Field(_D.straggler_min_s, ge=0)
    straggler_min_steps: int = Field(_D.straggler_min_steps, ge=1)
    idle_util: float = Field(_D.idle_util, ge=0, le=100)
    idle_min_s: float = Field(_D.idle_min_s, gt=0)
    low_util: float = Field(_D.low_util, ge=0, le=100)
    low_util_window_s: float = Field(_D.low_util_window_s, gt=0)
    memory_unused_share: float = Field(_D.memory_unused_share, ge=0, le=1)
    sample_stale_s: float = Field(_D.sample_stale_s, gt=0)
    suspect_window_days: float = Field(7.0, gt=0, le=366)
    """The period the suspect-GPU list and its alert look back over."""
    suspect_alert_jobs: int = Field(3, ge=0)
    """A GPU that hurt this many jobs in the period is sent to the alert sinks once a week, with a
    suggested drain line; 0: never."""
    suspect_interval_s: float = Field(600.0, gt=0)
    """How often the evaluator looks for GPUs that crossed ``suspect_alert_jobs``."""

    @field_validator("rules")
    @classmethod
    def _known_rules(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(RULES))
        if unknown:
            raise ValueError(f"unknown rule(s) {', '.join(unknown)}; the rules are {', '.join(RULES)}")
        return value

    def thresholds(self) -> HealthThresholds:
        return HealthThresholds(**{name: getattr(self, name) for name in HealthThresholds.__dataclass_fields__})


def load_health_settings(**overrides: Any) -> HealthSettings:
    """Load and validate; raises :class:`SettingsError` naming the bad value."""
    try:
        return HealthSettings(**overrides)
    except ValidationError as exc:
        raise SettingsError(validation_message("health", "JOBSIGHT_HEALTH_", exc)) from exc
