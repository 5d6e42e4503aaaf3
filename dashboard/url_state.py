"""The address bar as a page's state: a page's widgets start from its query parameters and write
them back when they change, so that copying the address reproduces what is on screen.

A page lists its :class:`Param` s, calls :func:`restore` before drawing the widgets (which then
take no ``value``/``index`` of their own: their state is already set) and :func:`store` after.
:func:`restore` gives a widget the address's value when the page opens, and again whenever the
address no longer holds what the page last wrote: a link followed within the session, or the
navigation's clean address (a page opened from the menu starts at its defaults).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import streamlit as st

from jobsight.rules import links

_WRITTEN: Final = "_url_state_written"
"""Session state: widget key → the text the page last wrote for it (``None``: left out)."""


@dataclass(frozen=True)
class Param:
    """One query parameter bound to one widget."""

    name: str
    """The query parameter."""
    key: str
    """The widget's key."""
    default: Any
    """What the widget shows when the address has no value for it, or one it cannot show."""
    parse: Callable[[str], Any]
    """The parameter's text to the widget's value; ``None`` when the text is not one of its values."""
    text: Callable[[Any], str] = str
    """The widget's value to the parameter's text."""
    always: bool = False
    """Write the parameter at the default too (a default that moves, like today's date, would
    otherwise make a copied address mean something else tomorrow)."""


def choice(options: Sequence[str]) -> Callable[[str], str | None]:
    """Parses a parameter that must be one of ``options``."""
    return lambda text: text if text in options else None


def token_choice(tokens: dict[str, str]) -> Callable[[str], str | None]:
    """Parses a short token of the address (``7d``) into the option it stands for (``last 7 days``)."""
    return lambda text: tokens.get(text)


def token_text(tokens: dict[str, str]) -> Callable[[str], str]:
    """The token of the address (``7d``) an option (``last 7 days``) is written as."""
    return {option: token for token, option in tokens.items()}.__getitem__


def percent(text: str) -> float | None:
    """A percentage between 0 and 100, else ``None``."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0.0 <= value <= 100.0 else None


def percent_text(value: float) -> str:
    return f"{value:g}"


def day(text: str) -> dt.date | None:
    return links.parse_day(text)


def day_text(value: dt.date) -> str:
    return value.isoformat()


def restore(params: Sequence[Param]) -> None:
    """Before the widgets: each widget's state from the address, when the page opens or the
    address changed since the page last wrote it; else the widget keeps what the user set."""
    written: dict[str, str | None] = st.session_state.setdefault(_WRITTEN, {})
    for param in params:
        text = st.query_params.get(param.name)
        if param.key in st.session_state and written.get(param.key) == text:
            continue
        value = param.parse(text) if text is not None else None
        st.session_state[param.key] = param.default if value is None else value
        written[param.key] = text


def store(params: Sequence[Param]) -> None:
    """After the widgets: the address holds each widget's value (left out at its default), and is
    written only where it changes."""
    written: dict[str, str | None] = st.session_state.setdefault(_WRITTEN, {})
    for param in params:
        value = st.session_state.get(param.key)
        at_default = value is None or value == "" or (value == param.default and not param.always)
        text = None if at_default else param.text(value)
        if st.query_params.get(param.name) != text:
            if text is None:
                del st.query_params[param.name]
            else:
                st.query_params[param.name] = text
        written[param.key] = text
