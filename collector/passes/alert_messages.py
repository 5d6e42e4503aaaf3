"""What an alert message says, and how it leaves: the one Apprise call, with its log kept in.

A message covers every outbox row that went due for one sink in one group window: a title with
the counts and one line per finding, each ending with the link to its job's page at the moment
the finding points at (:mod:`jobsight.rules.links`). What Apprise logs is held back from the
application's log (it names hosts and, at times, whole URLs) and kept only as the reason of a
failure, with every part of the URL taken out.

Everything a job sent is data, never markup: its id, its user, and the finding's subject, title and
message (which name its nodes and GPUs). Each is cut to a short length (:data:`LIMITS`, a word of
more than :data:`WORD_CHARS` characters too, with an ellipsis), control characters become ``?``,
and the whole body is written for the markup the sink renders (:func:`markup_of`), then handed to
Apprise *declared* in that format, so that Apprise converts nothing (its own conversions leave
``<`` live in Markdown, and a body of no declared format is one its Slack plugin turns
``&lt;!channel&gt;`` back into a mention):

* plain text: as is, with an invisible U+200B after each ``@`` and ``<`` and inside ``](``, so
  that a chat service that reads mentions and links in plain text (Discord renders Markdown in
  its text mode) finds none;
* Markdown: every ASCII punctuation character backslash-escaped (no link, image, HTML, emphasis
  or autolink forms), each ``@`` also followed by U+200B (Discord's ``@everyone`` ignores escapes);
* HTML: ``&``, ``<``, ``>`` and quotes as entities;
* Slack (Apprise's Slack plugin, in its default Markdown mode): ``\\ < > [ ] ( ) ! #``
  backslash-escaped, which Apprise's Slack dialect turns into Slack's own escapes (``&amp;``,
  ``&lt;``, ``&gt;``) and plain characters, so ``<!channel>``, ``<@U…>`` and ``<url|text>``
  cannot form; ``@`` as in plain text.

The title holds only our words and a job id or finding title reduced to letters, digits and
`` ._+-`` (anything else ``?``): Apprise gives a title to some plugins untouched and escapes it
in others (Slack), so it must need no escaping at all.
"""

from __future__ import annotations

import html
import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qsl, unquote

from jobsight.collector.config.alerts import quiet_apprise_logging
from jobsight.protocol.terminal_text import UNSAFE
from jobsight.rules import links

if TYPE_CHECKING:
    from apprise.plugins.base import NotifyBase

MAX_LINES = 50
"""Findings named in one message; a cluster-wide event lists the first ones and a count."""
MAX_ERROR_CHARS = 500
LIMITS: Final = {"job": 64, "user": 32, "word": 32, "subject": 96, "title": 120, "message": 600}
"""The most characters of each string a job supplied that a message shows (``word``: a rule or
severity name as stored)."""
WORD_CHARS: Final = 80
"""The longest run of non-blank characters shown inside a subject, title or message: a node or
GPU name in a finding's message is cut here."""
ELLIPSIS: Final = "…"
TITLE_ID_CHARS: Final = 40
_CONTROL = UNSAFE  # the one list of control, bidi and invisible characters (the CLI escapes the same)
_LONG_WORD = re.compile(rf"\S{{{WORD_CHARS + 1},}}")
_ZWSP: Final = "\u200b"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + ELLIPSIS


def shown(value: Any, limit: int) -> str:
    """``value`` (a string a job supplied) as a message may show it: control and invisible
    characters as ``?``, each word cut at :data:`WORD_CHARS`, the whole at ``limit``."""
    text = _CONTROL.sub("?", str(value))
    text = _LONG_WORD.sub(lambda word: _cut(word.group(), WORD_CHARS), text)
    return _cut(text, limit)


def title_safe(value: Any, limit: int = TITLE_ID_CHARS) -> str:
    """``value`` with nothing any markup reads: letters, digits and `` ._+-`` kept, anything
    else ``?``; cut at ``limit``."""
    text = "".join(c if c.isalnum() or c in " ._+-" else "?" for c in str(value))
    return _cut(text, limit)


# -- markups ---------------------------------------------------------------------------------

def _plain(text: str) -> str:
    return text.replace("@", "@" + _ZWSP).replace("<", "<" + _ZWSP).replace("](", "]" + _ZWSP + "(")


_MARKDOWN_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")


def markdown_escape(text: str) -> str:
    """CommonMark source that shows ``text`` literally (every ASCII punctuation escaped)."""
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", text).replace("@", "@" + _ZWSP)


_SLACK_DIALECT = re.compile(r"([\\<>\[\]()!#])")


def slack_escape(text: str) -> str:
    r"""Source for Apprise's Slack plugin (CommonMark, declared as such) that reaches Slack as
    ``text`` with ``&``, ``<`` and ``>`` escaped as Slack documents (``&amp;``, ``&lt;``, ``&gt;``):
    its dialect turns ``\<`` and ``\>`` into entities, escapes every bare ``&``, and drops the
    backslash before ``[ ] ( ) ! #``; ``\\`` keeps a user's backslash from escaping ours."""
    return _SLACK_DIALECT.sub(r"\\\1", text).replace("@", "@" + _ZWSP)


def _html_link(url: str) -> str:
    return f'<a href="{html.escape(url)}">{html.escape(url)}</a>'


@dataclass(frozen=True)
class Markup:
    """How a message's body is written for one kind of sink: ``declared`` is the Apprise format
    it is handed over in (``text``, ``markdown``, ``html``)."""

    name: str
    declared: str
    escape: Callable[[str], str]
    link: Callable[[str], str]
    newline: str = "\n"


TEXT: Final = Markup("text", "text", _plain, lambda url: url)
MARKDOWN: Final = Markup("markdown", "markdown", markdown_escape, lambda url: f"<{url}>")
HTML: Final = Markup("html", "html", html.escape, _html_link, "<br/>")
SLACK: Final = Markup("slack", "markdown", slack_escape, lambda url: f"<{url}>")
_BY_FORMAT: Final = {"text": TEXT, "markdown": MARKDOWN, "html": HTML}


def markup_of(service: NotifyBase) -> Markup:
    """The markup ``service`` (an Apprise plugin for one sink URL) renders: what its URL's
    ``format`` asks for, else plain text where it takes it, else its own format; Apprise's Slack
    plugin in Markdown (its default) gets :data:`SLACK`."""
    if type(service).__name__ == "NotifySlack":
        return SLACK if service.resolve_format("markdown").value == "markdown" else TEXT
    return _BY_FORMAT.get(service.resolve_format("text").value, TEXT)


# -- the message -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Link:
    """A link our own code made (the job page): written as each markup writes links."""

    url: str


Line = tuple[str | Link, ...]
"""One line of a message: text and links, in order."""


@dataclass(frozen=True)
class Message:
    """One alert: ``title`` needs no escaping (see :func:`title_safe`); ``lines`` are text (our
    words and bounded data, escaped when written) and links; ``kind`` the Apprise notify type."""

    title: str
    lines: tuple[Line, ...]
    kind: str

    def body(self, markup: Markup) -> str:
        """The body as ``markup`` writes it."""
        return markup.newline.join(
            "".join(markup.link(piece.url) if isinstance(piece, Link) else markup.escape(piece) for piece in line)
            for line in self.lines
        )


def _findings(count: int) -> str:
    return f"{count} finding{'' if count == 1 else 's'}"


def _counts(rows: Sequence[Mapping[str, Any]]) -> str:
    """``3 findings opened, 1 resolved``; ``2 findings resolved``."""
    opened = sum(1 for row in rows if row["event"] == "opened")
    resolved = len(rows) - opened
    if not opened:
        return f"{_findings(resolved)} resolved"
    return f"{_findings(opened)} opened" + (f", {resolved} resolved" if resolved else "")


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M UTC") if value is not None else "?"


def _field(row: Mapping[str, Any], name: str, limit: str) -> str:
    value = row.get(name)
    return shown(value, LIMITS[limit]) if value else ""


def _text(row: Mapping[str, Any]) -> str:
    subject = f" {_field(row, 'subject', 'subject')}" if row.get("subject") else ""
    rule = _field(row, "rule", "word")
    if row["event"] == "opened":
        return f"[{_field(row, 'severity', 'word')}] {rule}{subject}: {_field(row, 'message', 'message')}"
    return f"{rule}{subject}: {_field(row, 'title', 'title')} (open since {_when(row.get('opened_at'))})"


def _line(row: Mapping[str, Any], dashboard_url: str | None) -> Line:
    who = f" ({_field(row, 'user_name', 'user')})" if row.get("user_name") else ""
    head = f"{_field(row, 'event', 'word').upper()} job {shown(row['job_id'], LIMITS['job'])}{who}"
    if row.get("rule") is None:
        # The finding row is gone (retention): the alert still says which one it was.
        return (f"{head}: finding {row['finding_id']} (no longer stored)",)
    if not dashboard_url:
        return (f"{head} {_text(row)}",)
    moment = links.finding_moment(row.get("at_ts"), row.get("opened_at"))
    # The link is the job's own id, percent-encoded: it opens the job whatever the id holds.
    return (f"{head} {_text(row)} ", Link(links.job_link(row["cluster"], row["job_id"], moment, base=dashboard_url)))


def _kind(rows: Sequence[Mapping[str, Any]]) -> str:
    severities = {row.get("severity") for row in rows if row["event"] == "opened"}
    if "critical" in severities:
        return "failure"
    if "warning" in severities:
        return "warning"
    return "info" if severities else "success"


def message(rows: Sequence[Mapping[str, Any]], dashboard_url: str | None = None) -> Message:
    """The message for ``rows``: outbox rows joined with their finding and job (see alerts.CLAIM)."""
    if len(rows) == 1 and rows[0].get("title"):
        row = rows[0]
        title = (f"jobsight: {title_safe(row['event'])} on job {title_safe(row['job_id'])}: "
                 f"{title_safe(row['title'], LIMITS['title'])}")
    else:
        title = f"jobsight: {_counts(rows)}"
    lines = [_line(row, dashboard_url) for row in rows[:MAX_LINES]]
    if len(rows) > MAX_LINES:
        lines.append((f"... and {len(rows) - MAX_LINES} more",))
    return Message(title, tuple(lines), _kind(rows))


def compose(rows: Sequence[Mapping[str, Any]], dashboard_url: str | None = None) -> tuple[str, str, str]:
    """Title, plain-text body and Apprise notify type (``failure``, ``warning``, ``info``,
    ``success``) of the message for ``rows``."""
    composed = message(rows, dashboard_url)
    return composed.title, composed.body(TEXT), composed.kind


def redact(text: str, url: str) -> str:
    """``text`` without the URL or any part of it (host, user, password, path words, query
    values), raw or percent-decoded: Apprise's messages and a plugin's exceptions may quote them.
    Query keys (``to``, ``from``) are no secret and stay."""
    scheme, _, rest = url.partition("://")
    location, _, query = rest.partition("?")
    pieces = re.split(r"[/:@#,;+\s]+", location)
    for _, value in parse_qsl(query, keep_blank_values=False):
        pieces += [value, *re.split(r"[/:@,;+\s]+", value)]
    parts = {url, rest, unquote(url), unquote(rest)}
    for piece in pieces:
        parts.update({piece, unquote(piece)})
    for part in sorted((p for p in parts if len(p) >= 3 and p != scheme), key=len, reverse=True):
        text = text.replace(part, "[sink]")
    return text


class _AppriseSaid(logging.Handler):
    """Keeps what Apprise logs at warning and above while one delivery runs (Apprise may log
    from its own threads, so this is not per thread: deliveries take turns instead)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(record.getMessage())
        except (TypeError, ValueError):  # a malformed log call inside Apprise must not fail the send
            self.lines.append(str(record.msg))


class _WhileDelivering(logging.Filter):
    """Drops urllib3's connection lines while a delivery runs: at debug level they give the
    sink's host, port and path (a Slack or Teams webhook's path is its credential)."""

    def __init__(self) -> None:
        super().__init__()
        self.active = False

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.active


_said = _AppriseSaid()
_quiet_urllib3 = _WhileDelivering()
_delivery_turn = threading.Lock()
_URLLIB3_LOGGER = "urllib3.connectionpool"


def deliver(url: str, composed: Message) -> str | None:
    """Send one message through Apprise, written in the markup of the sink ``url`` names and
    declared as such. ``None`` when it went; else why not, without the URL."""
    import apprise  # the collector extra has it; imported here so the collector starts without loading it

    logger = quiet_apprise_logging()
    with _delivery_turn:
        logger.setLevel(logging.WARNING)
        if _said not in logger.handlers:
            logger.addHandler(_said)
        _said.lines = []
        urllib3_log = logging.getLogger(_URLLIB3_LOGGER)
        if _quiet_urllib3 not in urllib3_log.filters:
            urllib3_log.addFilter(_quiet_urllib3)
        _quiet_urllib3.active = True
        try:
            service = apprise.Apprise.instantiate(url)
            if service is None:
                return "the sink's URL is not one this Apprise can send to"
            markup = markup_of(service)
            sender = apprise.Apprise()
            sender.add(service)
            if sender.notify(title=composed.title, body=composed.body(markup),
                             notify_type=apprise.NotifyType(composed.kind),
                             body_format=apprise.NotifyFormat(markup.declared)):
                return None
            reason = "; ".join(_said.lines) or "Apprise reported the message not delivered"
        except Exception as exc:  # noqa: BLE001 - boundary: a plugin's own error is the sink's failure, not the sender's
            reason = f"{type(exc).__name__}: {exc}"
        finally:
            _quiet_urllib3.active = False
            logger.removeHandler(_said)
    return redact(reason, url)[:MAX_ERROR_CHARS]
