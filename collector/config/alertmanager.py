"""Alertmanager sinks: findings posted as alerts to a site's Alertmanager (v2 API), through the outbox.

Configured beside the Apprise sinks, in the ``[alerts]`` table (``JOBSIGHT_ALERTS_ALERTMANAGERS`` as
JSON), each with the same filter as a :class:`~jobsight.collector.config.alerts.Sink`:

```toml
[[alerts.alertmanagers]]
name = "am"
url = "http://alertmanager.example.org:9093"   # the base: alerts go to <url>/api/v2/alerts
rules = []                                      # empty: every rule
min_severity = "warning"
```

Alertmanager groups, routes, silences and repeats them; the outbox sends each open and each resolve
once (``group_window_s`` does not apply: Alertmanager groups). Their outbox rows are kept under the
sink name ``alertmanager:<name>`` (a colon no Apprise sink name can hold).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from jobsight.rules.health import SEVERITIES

ALERTMANAGER_SINK_PREFIX: Final = "alertmanager:"


class AlertmanagerSink(BaseModel):
    """One Alertmanager, with the filter that picks the findings it gets."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    """Names the sink in the outbox and in log lines (letters, digits, ``_.-``)."""
    url: str
    """The Alertmanager's base URL (``http(s)://host:9093``, with a path prefix if it has one)."""
    rules: list[str] = Field(default_factory=list)
    """Rules sent here; empty: every rule."""
    min_severity: str = "info"
    """Findings of this severity or worse (``info``, ``warning``, ``critical``)."""
    partitions: list[str] = Field(default_factory=list)
    """Only jobs of these partitions; empty: every job."""
    accounts: list[str] = Field(default_factory=list)
    """Only jobs of these accounts; empty: every job."""
    timeout_s: float = Field(10.0, gt=0, le=300)
    """How long one post may take before it counts as failed (and is retried with backoff)."""
    firing_for_s: float = Field(30 * 86400.0, ge=60, le=366 * 86400)
    """An open finding's alert says it fires until this long after it was sent (Alertmanager would
    otherwise resolve it after its ``resolve_timeout``, as nobody re-sends it); its resolve ends it."""

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL of an Alertmanager")
        return value.rstrip("/")

    @field_validator("min_severity")
    @classmethod
    def _known_severity(cls, value: str) -> str:
        if value not in SEVERITIES:
            raise ValueError(f"must be one of {', '.join(SEVERITIES)}")
        return value

    @property
    def sink(self) -> str:
        """Its name in the outbox."""
        return ALERTMANAGER_SINK_PREFIX + self.name

    def matches(self, finding: Mapping[str, Any], job: Mapping[str, Any]) -> bool:
        """Whether this Alertmanager gets alerts of ``finding`` (a ``findings`` row) of ``job``."""
        if self.rules and finding["rule"] not in self.rules:
            return False
        rank = {severity: i for i, severity in enumerate(SEVERITIES)}
        if rank.get(str(finding["severity"]), 0) < rank[self.min_severity]:
            return False
        if self.partitions and job.get("partition") not in self.partitions:
            return False
        return not (self.accounts and job.get("account") not in self.accounts)
