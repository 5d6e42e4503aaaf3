"""Text that came from a job or a user, made safe to print on a terminal.

A job's name, its user, partition and node names, a finding's message, a log line: any of them
may hold an escape sequence (ESC ``\\x1b`` or the one-byte CSI ``\\x9b``) that sets the terminal's
title, moves the cursor or rewrites the screen, a carriage return or a newline that forges a line
of the report, or a bidi override that shows a line in another order than it is stored.
:func:`terminal_safe` writes each such character as a visible escape (``\\x1b``, ``\\u202e``,
``\\n``), so the reader sees that it was there and what it was; everything else is left as it is.

:data:`UNSAFE` is the one list of those characters: alert and notice messages replace the same set
(collector/passes/alert_messages.py). Standard library only: the node's ``jobsight report`` uses it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

UNSAFE: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f"  # C0 (ESC, BEL, CR, LF, ...), DEL and C1 (CSI 0x9b, OSC 0x9d, ...)
    "\u061c\u200b-\u200f\u202a-\u202e\u2066-\u2069"  # bidi marks, overrides and isolates; zero widths
    "\u2028\u2029\u2060-\u2065\ufeff\ufff9-\ufffb"  # line and paragraph separators; invisible operators
    "\ud800-\udfff]"  # lone surrogates (JSON's "\ud800"): no terminal encoding can write one
)
"""Characters a terminal (or a reader) takes for something other than text."""
_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(found: re.Match[str]) -> str:
    char = found.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(value: object) -> str:
    """``str(value)`` with every :data:`UNSAFE` character written as its escape (``\\x1b``, ``\\n``,
    ``\\u202e``): one line, in the order it is stored, that sets nothing on the terminal."""
    return UNSAFE.sub(_escape, str(value))


def terminal_safe_tree(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, strings, numbers, ``None``) with every string in it, keys
    included, through :func:`terminal_safe`; anything else is returned as it is."""
    if isinstance(value, str):
        return terminal_safe(value)
    if isinstance(value, Mapping):
        return {terminal_safe_tree(k): terminal_safe_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [terminal_safe_tree(item) for item in value]
    return value
