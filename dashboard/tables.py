"""Every table a page shows, through one door: an absent value reads as the one missing mark of
:mod:`jobsight.rules.display_text` (Streamlit would print "None"), and every column is headed in
words (``self_cpu_us`` reads "self CPU (µs)"), the headers the report and the CLI use.

The data keep their names and types (a page's tests read them; numbers still sort as numbers):
only the headers and the missing cells are what a reader sees differently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import streamlit as st

from jobsight.rules import display_text


def headers(frame: pd.DataFrame, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``given`` (a page's own column settings) with a label in words for every column that has none:
    a plain string is a label, a column setting without ``label`` gets one, ``None`` (hidden) stays."""
    config: dict[str, Any] = dict(given or {})
    for name in map(str, frame.columns):
        setting = config.get(name, "")
        if name in config and setting is None:
            continue
        if isinstance(setting, str):
            config[name] = setting or display_text.column_label(name)
        elif isinstance(setting, dict) and not setting.get("label"):
            config[name] = {**setting, "label": display_text.column_label(name)}
    return config


def filled(frame: pd.DataFrame) -> list[str]:
    """The columns of ``frame`` that some row fills (a value that is neither missing nor empty text)."""
    return [str(name) for name in frame.columns
            if not frame[name].map(display_text.is_missing).all()]


def show(frame: pd.DataFrame, *, column_config: Mapping[str, Any] | None = None, **kwargs: Any) -> Any:
    """``st.dataframe`` with the missing mark and worded headers (``kwargs`` as ``st.dataframe``'s). A
    column no row fills (no job of the list in an array, none ended by jobsight) is left out of the view,
    not of the data: a table of many columns scrolled sideways at 1,600 pixels for columns of dashes."""
    if "column_order" not in kwargs and len(frame):
        kwargs["column_order"] = filled(frame)
    kwargs.setdefault("hide_index", True)
    kwargs.setdefault("width", "stretch")
    return st.dataframe(frame, column_config=headers(frame, column_config), placeholder=display_text.MISSING,
                        **kwargs)
