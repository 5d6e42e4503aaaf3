"""Any Python value reduced to what the wire accepts, so a record is never refused for it.

Log attributes and run metadata (hyper-parameters, ``params``, ``extra=``) hold anything:
NaN, huge integers, objects, deep or long containers, NUL characters, lone surrogates (a file
name that is not UTF-8, through ``os.fsdecode``). One function and one set of caps serve the
log handler and the run records alike; :func:`clip` is what every string of theirs goes through.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from jobsight.protocol.checks import lone_surrogate
from jobsight.protocol.wire import MAX_MESSAGE, MAX_STRING

MAX_DEPTH: Final = 8
"""Containers nested deeper than this become their ``repr`` (the wire allows 16)."""
MAX_ITEMS: Final = 1000
"""Items kept of one dict or list."""
MAX_REPR: Final = 1024
"""Characters kept of an object's ``repr``."""
_INT64: Final = range(-(2**63), 2**63)


def _without_surrogates(text: str) -> str:
    """``text`` with each lone surrogate written out as an escape, which PostgreSQL can store."""
    try:
        # os.fsdecode (file names, argv, the environment) turns each byte that is not UTF-8
        # into one of U+DC80..U+DCFF: back to that byte, shown as "\xff".
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        # Some other lone surrogate (JSON's "\ud800" escape parses into one): shown as "\ud800".
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def clip(text: str, limit: int, *, tail: bool = False) -> str:
    """``text`` as the collector accepts it: no NUL characters, no lone surrogates, at most ``limit``
    characters (its start, or with ``tail`` its end, as for a traceback)."""
    if not text.isascii() and lone_surrogate(text):  # ASCII, the common case, costs one scan
        text = _without_surrogates(text)
    if "\x00" in text:
        text = text.replace("\x00", "\\0")
    if len(text) <= limit:
        return text
    return "…" + text[len(text) - limit + 1 :] if tail else text[: limit - 1] + "…"


def json_safe(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON the wire accepts: NaN and infinities and integers beyond 64 bits
    become strings, strings are clipped, other objects become their (clipped) ``repr``."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if value in _INT64 else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return clip(value, MAX_MESSAGE)
    if depth < MAX_DEPTH:
        if isinstance(value, Mapping):
            items = list(value.items())[:MAX_ITEMS]
            return {clip(str(key), MAX_STRING): json_safe(item, depth + 1) for key, item in items}
        if isinstance(value, (list, tuple)):
            return [json_safe(item, depth + 1) for item in list(value)[:MAX_ITEMS]]
    try:
        return clip(repr(value), MAX_REPR)
    except Exception:  # noqa: BLE001 - boundary: a broken __repr__ must not lose the record
        return f"<unrepresentable {type(value).__name__}>"
