"""What is wrong with one value of a record, if anything.

Each function here looks at one value and returns the problem in a few words, or ``None``
when there is none; :mod:`jobsight.protocol.wire` turns a problem into a ``WireError``
naming the record and the field. They hold the checks that need more than a type test
(the validator's fast path decides the common values without calling them), with the caps
passed in, so that the caps are declared once, in ``wire``.

Each refuses a value that would otherwise pass validation and then fail at the database
(an answer of 500, which senders retry) or be stored wrong.
"""

from __future__ import annotations

import base64
import binascii
import math
import zlib
from typing import Any, Final

from jobsight.protocol.records import Range

LONE_SURROGATE: Final = "string is not valid UTF-8 (lone surrogate)"
_INFLATE_CHUNK: Final = 1024 * 1024
"""Bytes inflated at a time: a gzip bomb is measured a chunk at a time, never held whole."""


def lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a code point of U+D800..U+DFFF on its own.

    Python's ``json`` parses the escape ``"\\udcff"`` into such a string, and
    ``os.fsdecode`` makes one of every byte that is not UTF-8; PostgreSQL stores text as
    UTF-8, which has no encoding for it. ASCII text cannot hold one, so callers ask
    ``isascii()`` first and pay for this only on the rest."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def string_problem(value: str, limit: int) -> str | None:
    if "\x00" in value:
        return "NUL character in string"  # PostgreSQL's text and jsonb refuse it
    if len(value) > limit:
        return f"string longer than {limit} characters"
    if not value.isascii() and lone_surrogate(value):
        return LONE_SURROGATE
    return None


def integer_problem(value: int, bounds: Range) -> str | None:
    if not bounds.lo <= value <= bounds.hi:
        return f"integer out of range for its column ({bounds.lo}..{bounds.hi})"
    return None


def number_problem(value: int | float, bounds: Range) -> str | None:
    """A number for a float8 column: finite, a float (an integer such as ``10**400`` is not),
    and inside the field's physical bounds."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN or Infinity"
    if isinstance(value, int):
        try:
            float(value)
        except OverflowError:
            return "number too large for a float8"
    if not bounds.lo <= value <= bounds.hi:
        return f"number out of range for this field ({bounds.lo:g}..{bounds.hi:g})"
    return None


def json_problem(value: Any, max_depth: int, text_limit: int, key_limit: int, depth: int = 0) -> str | None:
    """Problems of any JSON value: strings as :func:`string_problem` says (keys included),
    floats finite, containers nested at most ``max_depth`` deep.

    It recurses once per level of containers and refuses a container at ``max_depth``
    before looking inside it, so the deepest value costs ``max_depth`` frames, not more."""
    if isinstance(value, str):
        return string_problem(value, text_limit)
    if isinstance(value, float):
        return None if math.isfinite(value) else "NaN or Infinity"
    if isinstance(value, (dict, list)):
        if depth >= max_depth:
            return "JSON nested too deeply"
        if isinstance(value, dict):
            for key in value:
                problem = string_problem(str(key), key_limit)
                if problem is not None:
                    return problem
            value = value.values()
        for item in value:
            # Scalars here, containers one level down: a call for a number would cost more
            # than the test.
            if isinstance(item, (str, float, dict, list)):
                problem = json_problem(item, max_depth, text_limit, key_limit, depth + 1)
                if problem is not None:
                    return problem
    return None


def object_problem(value: Any) -> str | None:
    return None if isinstance(value, dict) else "expected a JSON object"


def hints_problem(value: Any) -> str | None:
    """A diagnosis: a list of hints, each an object with a string ``rule`` (what readers key on)."""
    if not isinstance(value, list):
        return "expected a list of hints"
    for hint in value:
        if not isinstance(hint, dict) or not isinstance(hint.get("rule"), str):
            return "expected each hint to be an object with a string rule"
    return None


def gzip_base64_problem(value: str, inflated_limit: int) -> str | None:
    """Base64 of exactly one complete gzip stream that inflates to at most ``inflated_limit``
    bytes. Inflated ``_INFLATE_CHUNK`` at a time and thrown away, so a bomb costs one chunk of
    memory and stops at the limit."""
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):  # ValueError: characters that are not ASCII
        return "not valid base64"
    inflater = zlib.decompressobj(wbits=31)  # gzip framing only
    size = 0
    data = raw
    try:
        while not inflater.eof:
            chunk = inflater.decompress(data, _INFLATE_CHUNK)
            data = inflater.unconsumed_tail
            size += len(chunk)
            if size > inflated_limit:
                return f"trace inflates to more than {inflated_limit} bytes"
            if not chunk and not data and not inflater.eof:
                return "not a complete gzip stream"
    except zlib.error as exc:
        return f"not a valid gzip stream ({exc})"
    if inflater.unused_data:
        return "trailing bytes after the gzip stream"
    return None
