"""Every chart of the dashboard reaches the browser through :func:`show`: an Altair chart as the
Vega-Lite spec Streamlit would send, built without Altair's check of the spec against the
Vega-Lite schema.

That check is for a chart's author, not its reader: it ran on every chart of every page load (a
64-GPU job page's eight charts spent about a third of its server time in ``jsonschema``), while
what it checks is the same on every load of the same code. Every chart builder of
:mod:`jobsight.dashboard.charts` is checked once, in the tests, through Altair's own
``to_dict()`` (``tests/dashboard/test_chart_specs.py``).

The data go as Streamlit sends an Altair chart's: each dataset by name beside the spec, turned
into Arrow by Streamlit, never into JSON rows."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from typing import Any, Final

import altair as alt
import pandas as pd
import streamlit as st
from altair.utils import schemapi
from altair.vegalite.v6.schema import core

TRANSFORMER: Final = "jobsight_named_datasets"
TITLE_ROOM_PX: Final = 4
_LOCK = threading.Lock()
"""Altair's theme and data transformer are process-wide; pages render in threads of one process."""


def _dataset_name(data: Any) -> str:
    """A name from the data's content, as Streamlit names an Altair chart's datasets: the same data
    keep the same name from one rerun to the next, so the browser keeps the chart it drew."""
    try:
        rows = pd.util.hash_pandas_object(data, index=False).to_numpy().tobytes()
    except (TypeError, ValueError):  # not a frame, or cells pandas cannot hash (lists): named once
        return f"data-{id(data):x}"
    digest = hashlib.sha1(rows, usedforsecurity=False)
    digest.update(",".join(map(str, data.columns)).encode())
    return f"data-{digest.hexdigest()[:20]}"


AS_SENT: Final = "jobsight_as_sent"
"""A frame's ``attrs`` key (:func:`as_sent`): the browser takes its times as Streamlit sends them."""


def as_sent(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame``, marked so that the browser takes its values as Streamlit sends them, without Vega-Lite's
    parse of each time field. Streamlit sends a UTC time as epoch milliseconds, which a UTC scale reads
    as they are; the parse is an interpreted ``toDate()`` a row and a field (Streamlit's Vega runs
    expressions through an interpreter, not as compiled code), 16,000 calls for a 64-GPU heatmap.
    Only for charts that format no time of a row themselves (a time unit needs a date)."""
    marked = frame.copy(deep=False)
    marked.attrs[AS_SENT] = True
    return marked


def _by_name(data: Any, datasets: dict[str, Any]) -> dict[str, Any]:
    name = _dataset_name(data)
    datasets[name] = data
    if getattr(data, "attrs", {}).get(AS_SENT):
        return {"name": name, "format": {"parse": None}}
    return {"name": name}


alt.data_transformers.register(TRANSFORMER, _by_name)
# Altair checks every schema object it makes against its part of the Vega-Lite schema as it is made
# ("debug mode"): a few hundred checks on every job page load, about 20 ms of its server time, for the
# same charts from the same code every time. The tests check every chart builder's whole spec instead.
schemapi.disable_debug_mode()


class Layers(alt.LayerChart):
    """An :class:`altair.LayerChart` of layers that carry no parameters (selections, variables), built
    without Altair's merge of them. That merge deep-copies every layer, and a layer of layers again:
    about 12 ms of a step chart's 16 with the timeline's markers over it, on every page load, for
    parameters these charts do not have. The layers' heights and widths go to the whole, as Vega-Lite
    wants them and as Altair's own constructor moves them. Specs built with it are checked against the
    Vega-Lite schema in the tests like every other (``tests/dashboard/test_chart_specs.py``)."""

    def __init__(self, layer: Sequence[alt.Chart | alt.LayerChart], **kwds: Any) -> None:
        layers = list(layer)
        for prop in _LAYER_PROPS:
            sizes = [size for chart in layers if (size := getattr(chart, prop, alt.Undefined)) is not alt.Undefined]
            if sizes and prop not in kwds:
                kwds[prop] = sizes[0]
            layers = [_without(chart, prop) for chart in layers]
        core.TopLevelLayerSpec.__init__(self, layer=layers, **kwds)


_LAYER_PROPS: Final = ("height", "width")


def _without(chart: alt.Chart | alt.LayerChart, prop: str) -> alt.Chart | alt.LayerChart:
    """``chart`` without ``prop``: itself when it has none, else a shallow copy (the caller's chart is kept)."""
    if getattr(chart, prop, alt.Undefined) is alt.Undefined:
        return chart
    bare = chart.copy(deep=False)
    bare[prop] = alt.Undefined
    return bare


def spec(chart: alt.TopLevelMixin) -> dict[str, Any]:
    """``chart`` as a Vega-Lite spec with its datasets (frames) under ``datasets``, unchecked."""
    datasets: dict[str, Any] = {}
    with _LOCK, alt.theme.enable("none"), alt.data_transformers.enable(TRANSFORMER, datasets=datasets):
        out: dict[str, Any] = chart.to_dict(validate=False)
    out["datasets"] = {**(out.get("datasets") or {}), **datasets}
    # Streamlit pads a chart's bottom only; a title on the drawing's top edge then had the top of its
    # line box (the font's ascent, a few pixels above the capitals) outside the chart's own box.
    out.setdefault("padding", {"top": TITLE_ROOM_PX})
    return out


def show(chart: alt.TopLevelMixin, height: int | None = None) -> None:
    """``chart`` on the page, the container's width and ``height`` pixels tall (``None``: its own)."""
    st.vega_lite_chart(spec=spec(chart), width="stretch", height="content" if height is None else height)
