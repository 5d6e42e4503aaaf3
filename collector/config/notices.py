"""Settings of the notices people get by e-mail or chat (``collector/passes/notices.py``, ``reports.py``).

From ``JOBSIGHT_NOTICES_*`` variables (lists and maps as JSON) and the ``[notices]`` table of the
``JOBSIGHT_CONFIG`` file; a bad value stops the collector with a message naming it. Where a user is
reached is the alerts' business (``[alerts]``: ``user_addresses``, ``user_address_template``); sending
and retrying is the alerts' too (``retry_base_s``, ``retry_max_s``, ``max_attempts``).

```toml
[notices]
job_end_summary = "listed"          # off | listed | all
job_end_users = ["alice", "bob"]    # the users who asked for it ("listed")
report_period = "monthly"           # off | weekly | monthly
account_sponsors = { physics = ["prof_a"] }
```
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationError
from pydantic_settings import SettingsConfigDict

from jobsight.collector.config.toml_settings import SettingsError, TomlTableSettings, validation_message


class NoticeSettings(TomlTableSettings):
    model_config = SettingsConfigDict(env_prefix="JOBSIGHT_NOTICES_", extra="ignore")
    toml_table: ClassVar[str] = "notices"

    warn_users: bool = True
    """A waste policy's warnings and its action reach the job's user (dry runs reach nobody)."""
    job_end_summary: Literal["off", "listed", "all"] = "off"
    """When a job ends its owner gets its efficiency report (the text of ``jobsight report``): never,
    only the users in ``job_end_users`` (opt-in per user), or every user with an address."""
    job_end_users: list[str] = Field(default_factory=list)
    report_period: Literal["off", "weekly", "monthly"] = "off"
    """A report per user and per account sponsor for each closed week (Monday to Monday, UTC) or month."""
    account_sponsors: dict[str, list[str]] = Field(default_factory=dict)
    """Account -> the users who get its report (a PI, a group's sponsor)."""
    worst_jobs: int = Field(5, ge=0, le=50)
    """Jobs named in a periodic report, the most idle GPU-hours first."""
    interval_s: float = Field(60.0, ge=0, le=86400)
    """Seconds between the passes that write job-end summaries and periodic reports; 0 turns both off."""
    poll_interval_s: float = Field(2.0, gt=0, le=3600)
    """How often the sender looks for notices that are due."""


def load_notice_settings(**overrides: Any) -> NoticeSettings:
    """Load and validate; raises :class:`SettingsError` naming the bad value."""
    try:
        return NoticeSettings(**overrides)
    except ValidationError as exc:
        raise SettingsError(validation_message("notices", "JOBSIGHT_NOTICES_", exc)) from exc
