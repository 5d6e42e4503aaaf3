"""Alert settings: where findings are sent, read like the collector's own settings.

From ``JOBSIGHT_ALERTS_*`` variables (lists and maps as JSON) and the ``[alerts]`` table of the
``JOBSIGHT_CONFIG`` file; a bad value stops the collector with a message naming it. Sink URLs
and user addresses are Apprise URLs, which carry credentials: they are ``SecretStr`` so that no
repr, log line or error message ever shows them.

```toml
[alerts]
group_window_s = 60
[[alerts.sinks]]
name = "ops"
url = "slack://T000/B000/XXXX"
rules = ["hung_rank"]          # empty: every rule
min_severity = "warning"
partitions = ["gpu"]           # empty: every partition
```
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import SettingsConfigDict

from jobsight.collector.config.alertmanager import ALERTMANAGER_SINK_PREFIX, AlertmanagerSink
from jobsight.collector.config.toml_settings import SettingsError, TomlTableSettings, validation_message
from jobsight.rules.health import SEVERITIES

SEVERITY_RANK: dict[str, int] = {severity: rank for rank, severity in enumerate(SEVERITIES)}
"""The health rules' severities, least first."""
USER_SINK_PREFIX = "user:"
"""Outbox rows for a job's own user are kept under the sink name ``user:<name>``; sink names
cannot contain a colon, so the two never collide."""

_SINK_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_PLAIN_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
"""A user name put into ``user_address_template``: a POSIX-portable name, nothing that could add a
recipient or a parameter to the URL (``&to=``, ``,``, ``@``, ``/``)."""
USER_PLACEHOLDER = "{user}"

# Apprise's own log lines name hosts and, for a URL it cannot parse, the whole URL: they never
# reach the collector's log (see quiet_apprise_logging).
_APPRISE_LOGGER = "apprise"


def quiet_apprise_logging() -> logging.Logger:
    """Stop Apprise's logger from printing anything through the application's handlers (it
    names sink URLs, which carry credentials). Safe to call more than once; the sender reads
    what Apprise said through its own handler and removes the URLs before keeping any of it."""
    logger = logging.getLogger(_APPRISE_LOGGER)
    logger.propagate = False
    if not any(isinstance(handler, logging.NullHandler) for handler in logger.handlers):
        logger.addHandler(logging.NullHandler())
    return logger


def apprise_url_is_known(url: str) -> bool:
    """Whether this installation of Apprise can send to ``url`` (scheme known, URL parses)."""
    import apprise  # the collector extra has it; imported here so settings load fast without alerts

    quiet_apprise_logging()
    return apprise.Apprise.instantiate(url) is not None


class Sink(BaseModel):
    """One place alerts go, with the filter that picks the findings it gets."""

    model_config = ConfigDict(extra="forbid")

    name: str
    """Names the sink in the outbox and in log lines (letters, digits, ``_.-``)."""
    url: SecretStr
    """An Apprise URL (``json://host/path``, ``mailtos://…``, ``slack://…``); never logged. Its
    ``format`` (``text``, ``markdown``, ``html``), where the service takes several, picks the markup
    messages are written in for it, the job's strings escaped for that markup
    (:func:`jobsight.collector.passes.alert_messages.markup_of`)."""
    rules: list[str] = Field(default_factory=list)
    """Rules sent here; empty: every rule."""
    min_severity: str = "info"
    """Findings of this severity or worse (``info``, ``warning``, ``critical``)."""
    partitions: list[str] = Field(default_factory=list)
    """Only jobs of these partitions; empty: every job (a job with no partition included)."""
    accounts: list[str] = Field(default_factory=list)
    """Only jobs of these accounts; empty: every job."""

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if not _SINK_NAME.match(value):
            raise ValueError("a sink name is 1-64 letters, digits, '_', '.' or '-'")
        return value

    @field_validator("min_severity")
    @classmethod
    def _known_severity(cls, value: str) -> str:
        if value not in SEVERITY_RANK:
            raise ValueError(f"must be one of {', '.join(SEVERITIES)}")
        return value

    @field_validator("url")
    @classmethod
    def _known_url(cls, value: SecretStr) -> SecretStr:
        # The message never repeats the URL: it carries credentials.
        if not apprise_url_is_known(value.get_secret_value()):
            raise ValueError("url is not an Apprise URL this installation can send to")
        return value

    def matches(self, finding: Mapping[str, Any], job: Mapping[str, Any]) -> bool:
        """Whether this sink gets alerts of ``finding`` (a ``findings`` row) of ``job``."""
        if self.rules and finding["rule"] not in self.rules:
            return False
        if SEVERITY_RANK.get(str(finding["severity"]), 0) < SEVERITY_RANK[self.min_severity]:
            return False
        if self.partitions and job.get("partition") not in self.partitions:
            return False
        return not (self.accounts and job.get("account") not in self.accounts)


class AlertSettings(TomlTableSettings):
    model_config = SettingsConfigDict(env_prefix="JOBSIGHT_ALERTS_", extra="ignore")
    toml_table: ClassVar[str] = "alerts"

    sinks: list[Sink] = Field(default_factory=list)
    """Where alerts go; none: no alerts (the sender idles)."""
    alertmanagers: list[AlertmanagerSink] = Field(default_factory=list)
    """Alertmanagers that get each finding as an alert (:mod:`jobsight.collector.config.alertmanager`)."""
    notify_users: bool = False
    """Also tell a job's own user, at their address in ``user_addresses`` (users not there: not told)."""
    user_addresses: dict[str, SecretStr] = Field(default_factory=dict)
    """User name -> Apprise URL (``mailtos://…?to=alice@example.org``); never logged."""
    user_address_template: SecretStr | None = None
    """An Apprise URL with ``{user}`` where the user name goes (``mailto://smtp.example.org?from=hpc@example.org
    &to={user}@example.org``), for users not in ``user_addresses``: sites where every user has a mailbox by
    name. Only plain user names are put in (letters, digits, ``_.-``); never logged."""
    group_window_s: float = Field(60.0, ge=0, le=86400)
    """A sink gets at most one message per window: what comes due meanwhile goes as one message
    when the window ends; the first alert to a quiet sink goes at once."""
    retry_base_s: float = Field(10.0, gt=0, le=86400)
    """First wait after a failed send; doubled on each further failure of the same alert."""
    retry_max_s: float = Field(900.0, gt=0, le=7 * 86400)
    """The longest wait between two tries."""
    max_attempts: int = Field(20, ge=1, le=10_000)
    """Failed tries after which an alert is given up (logged once, without the URL)."""
    poll_interval_s: float = Field(2.0, gt=0, le=3600)
    """How often the sender looks for alerts that are due."""

    @field_validator("sinks")
    @classmethod
    def _unique_names(cls, sinks: list[Sink]) -> list[Sink]:
        seen: set[str] = set()
        for sink in sinks:
            if sink.name in seen:
                raise ValueError(f"two sinks are named {sink.name!r}")
            seen.add(sink.name)
        return sinks

    @field_validator("user_addresses")
    @classmethod
    def _known_addresses(cls, addresses: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for user, url in addresses.items():
            if not apprise_url_is_known(url.get_secret_value()):
                raise ValueError(f"the address of user {user!r} is not an Apprise URL this installation can send to")
        return addresses

    @field_validator("user_address_template")
    @classmethod
    def _usable_template(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        template = value.get_secret_value()
        if USER_PLACEHOLDER not in template:
            raise ValueError("must hold {user} where the user name goes")
        if not apprise_url_is_known(template.replace(USER_PLACEHOLDER, "someone")):
            raise ValueError("is not an Apprise URL this installation can send to, with a user name put in")
        return value

    @field_validator("retry_max_s")
    @classmethod
    def _max_not_below_base(cls, value: float, info: ValidationInfo) -> float:
        base = info.data.get("retry_base_s")
        if base is not None and value < base:
            raise ValueError("must be at least retry_base_s")
        return value

    def address_of(self, user_name: str | None) -> SecretStr | None:
        """Where ``user_name`` is reached: their entry in ``user_addresses``, else the template with their
        name put in (a plain name only); ``None`` when neither gives one."""
        if not user_name:
            return None
        if user_name in self.user_addresses:
            return self.user_addresses[user_name]
        if self.user_address_template is not None and _PLAIN_USER.match(user_name):
            return SecretStr(self.user_address_template.get_secret_value().replace(USER_PLACEHOLDER, user_name))
        return None

    def user_sink(self, user_name: str | None) -> str | None:
        """The outbox sink name for ``user_name``'s own alerts; ``None`` when they are not told."""
        if self.notify_users and user_name and self.address_of(user_name) is not None:
            return USER_SINK_PREFIX + user_name
        return None

    def url_of(self, sink: str) -> SecretStr | None:
        """The URL of an outbox sink name: a configured sink's, or ``user:<name>``'s address."""
        if sink.startswith(USER_SINK_PREFIX):
            return self.address_of(sink[len(USER_SINK_PREFIX):])
        return next((configured.url for configured in self.sinks if configured.name == sink), None)

    def alertmanager_of(self, sink: str) -> AlertmanagerSink | None:
        """The Alertmanager an outbox sink name (``alertmanager:<name>``) names; ``None``: not one (any more)."""
        if not sink.startswith(ALERTMANAGER_SINK_PREFIX):
            return None
        return next((am for am in self.alertmanagers if am.sink == sink), None)

    def can_send(self) -> bool:
        """Whether any alert can go anywhere (a sink, a user's address, the address template)."""
        return bool(self.sinks) or bool(self.alertmanagers) or (
            self.notify_users and bool(self.user_addresses or self.user_address_template))

    def sink_urls(self) -> dict[str, SecretStr]:
        """Every outbox sink name this configuration can name in advance, with its URL (the template's
        users are not listed: :meth:`url_of` resolves them)."""
        urls = {sink.name: sink.url for sink in self.sinks}
        if self.notify_users:
            urls.update({USER_SINK_PREFIX + user: url for user, url in self.user_addresses.items()})
        return urls


def load_alert_settings(**overrides: Any) -> AlertSettings:
    """Load and validate; raises :class:`SettingsError` naming the bad value (never a URL)."""
    try:
        return AlertSettings(**overrides)
    except ValidationError as exc:
        # Not chained: pydantic's own message quotes the input, and a sink's input is its URL.
        raise SettingsError(validation_message("alerts", "JOBSIGHT_ALERTS_", exc)) from None
