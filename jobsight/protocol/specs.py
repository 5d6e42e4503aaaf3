"""How a field's declared type (:mod:`jobsight.protocol.records`) becomes what the validator checks.

Three tables come out of one annotation, each by a function here: the field's wire spec
(:func:`spec_of`: ``"int?"``, ``"text"``), its bounds when it is a number (:func:`range_of`)
and the content it must hold beyond its type (:func:`wire_contents`).
:mod:`jobsight.protocol.wire` builds its validation tables (``FIELDS``, ``RANGES``) from them.
"""

from __future__ import annotations

import sys
from dataclasses import fields as dataclass_fields
from types import UnionType
from typing import Annotated, Any, Final, Union, get_args, get_origin, get_type_hints

from jobsight.protocol.records import Content, Int64, Range, WireSpec

_PLAIN_SPECS: Final[dict[Any, str]] = {str: "str", int: "int", float: "float", bool: "bool"}


def spec_of(hint: Any) -> str:
    """The wire spec of a field annotation in :mod:`jobsight.protocol.records`.

    ``str``, ``int``, ``float``, ``bool`` are specs of the same name; ``Annotated[..., WireSpec(s)]``
    (``records.Text``, ``records.Json``) is ``s``; ``Annotated[int, Range(...)]`` (``records.Int4``,
    ``records.Percent``) is the spec of its type; ``list[str]`` and ``list[int]`` are ``"str_list"``
    and ``"int_list"``; ``X | None`` is the spec of ``X`` plus ``"?"`` (absent or null allowed).
    Anything else raises ``TypeError``, so a field the validator cannot check never loads."""
    optional = False
    if get_origin(hint) in (Union, UnionType):
        members = [arg for arg in get_args(hint) if arg is not type(None)]
        if len(members) != 1 or len(get_args(hint)) != 2:
            raise TypeError(f"no wire spec for {hint!r}: only X | None unions")
        optional, hint = True, members[0]
    if get_origin(hint) is Annotated:
        marks = [mark for mark in hint.__metadata__ if isinstance(mark, WireSpec)]
        bounds = [mark for mark in hint.__metadata__ if isinstance(mark, Range)]
        if bounds:
            # A Range marks an int or a float, whose spec is its type's (a marker such as
            # Int4 adds bounds, not a kind of value).
            spec = spec_of(hint.__origin__)
            if marks or len(bounds) != 1 or spec not in ("int", "float"):
                raise TypeError(f"no wire spec for {hint!r}: one Range, on an int or a float")
        elif len(marks) != 1:
            raise TypeError(f"no wire spec for {hint!r}: expected one WireSpec or one Range")
        else:
            spec = marks[0].spec
    elif get_origin(hint) is list and get_args(hint) in ((str,), (int,)):
        spec = f"{_PLAIN_SPECS[get_args(hint)[0]]}_list"
    elif hint in _PLAIN_SPECS:
        spec = _PLAIN_SPECS[hint]
    else:
        raise TypeError(f"no wire spec for {hint!r}")
    return f"{spec}?" if optional else spec


def wire_fields(shape: type[Any]) -> dict[str, str]:
    """A records dataclass's fields as ``{name: spec}``, in declaration order."""
    hints = get_type_hints(shape, include_extras=True)
    return {f.name: spec_of(hints[f.name]) for f in dataclass_fields(shape)}


FINITE: Final = Range(-sys.float_info.max, sys.float_info.max)
"""The bounds of a ``float`` field without a :class:`~jobsight.protocol.records.Range`."""


def _marks(hint: Any) -> tuple[Any, ...]:
    """The ``Annotated`` marks of a field's type, ``X | None`` looked through."""
    if get_origin(hint) in (Union, UnionType):
        hint = next(arg for arg in get_args(hint) if arg is not type(None))
    return tuple(hint.__metadata__) if get_origin(hint) is Annotated else ()


def range_of(hint: Any) -> Range | None:
    """The bounds of an ``int`` or ``float`` field (``None`` for other fields): its
    :class:`~jobsight.protocol.records.Range`, else int8's for an int and any finite float."""
    spec = spec_of(hint).rstrip("?")
    if spec not in ("int", "float"):
        return None
    marked = [mark for mark in _marks(hint) if isinstance(mark, Range)]
    return marked[0] if marked else Int64 if spec == "int" else FINITE


def wire_ranges(shape: type[Any]) -> dict[str, Range]:
    """The bounds of a records dataclass's ``int`` and ``float`` fields, ``{name: Range}``."""
    hints = get_type_hints(shape, include_extras=True)
    bounds = {f.name: range_of(hints[f.name]) for f in dataclass_fields(shape)}
    return {name: rng for name, rng in bounds.items() if rng is not None}


def wire_contents(shape: type[Any]) -> dict[str, str]:
    """The :class:`~jobsight.protocol.records.Content` each field must hold, ``{name: content}``."""
    hints = get_type_hints(shape, include_extras=True)
    found = {f.name: [m.name for m in _marks(hints[f.name]) if isinstance(m, Content)] for f in dataclass_fields(shape)}
    return {name: names[0] for name, names in found.items() if names}
