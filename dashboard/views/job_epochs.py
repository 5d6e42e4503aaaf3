"""The job page's energy section: the whole job's energy (GPUs and its share of its nodes) and
emissions with their method and sources, and per epoch its duration, throughput, energy (GPUs, nodes,
both, kg CO2e at the job's intensity) and joules per sample, as a table and a chart over the run.

Not a page of its own: :mod:`jobsight.dashboard.views.job` calls :func:`show`.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from jobsight.dashboard import charts, data, tables, vega
from jobsight.rules import display_text, energy_text

GROWING = "≥"
"""The mark before a running job's figure that will still grow (display_text's, without its space)."""


def show(ref: data.JobRef, running: bool, every: dt.timedelta | None) -> None:
    """The section, redrawn every ``every`` while the job runs (``None``: drawn once)."""
    st.fragment(_section, run_every=every)(ref, running)


def _method_note(answer: dict[str, Any]) -> str:
    gpus = answer["gpus"]
    counted, integrated = gpus.get("counter", 0), gpus.get("power integral", 0)
    if not integrated:
        return f"From the energy counters of the job's {counted} GPU(s)."
    return (f"{integrated} GPU(s) have no energy counter: their energy is their power integrated over time "
            f"(method \"power integral\"), a little less exact than the counter"
            + (f" that the other {counted} GPU(s) have." if counted else "."))


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    for column in ("start", "end"):
        frame[column] = pd.to_datetime(frame[column], utc=True)
    return frame


def _energies(kwh: Any, growing: Any, kg_per_kwh: float | None = None) -> str:
    """An epoch's energy (or, given ``kg_per_kwh``, its emissions) as the metrics above print the whole
    job's: :func:`display_text.energy`'s five significant digits, "≥" while it grows, "-" when unknown."""
    grows = bool(growing) and not display_text.is_missing(growing)
    if kg_per_kwh is None:
        return display_text.energy(kwh, growing=grows, unit=False)
    return display_text.co2e(None if display_text.is_missing(kwh) else kwh * kg_per_kwh, growing=grows, unit=False)


def _table(frame: pd.DataFrame, kg_per_kwh: float | None) -> pd.DataFrame:
    """The epochs' table. Its kWh and kg CO2e cells are text, as display_text writes them: a fixed-decimals
    number column would print the same energy in other digits than the metrics above (2.3360 beside 2.3361)
    and could not mark the running epoch's "≥". They sort as text; "J" is the same GPU energy as a number."""
    growing = list(frame["growing"])
    node_kwh = frame["node_energy_j"] / J_PER_KWH
    return pd.DataFrame({
        "epoch": frame["epoch"], "start": frame["start"], "end": frame["end"], "duration s": frame["duration_s"],
        "steps": frame["steps"], "samples": frame["samples"], "samples/s": frame["samples_per_s"],
        "GPU kWh": [_energies(v, g) for v, g in zip(frame["energy_kwh"], growing, strict=True)],
        "J": frame["energy_j"], "J/sample": frame["j_per_sample"],
        "mean W": frame["mean_power_w"], "method": frame["method"],
        "node kWh": [_energies(v, g) for v, g in zip(node_kwh, growing, strict=True)],
        "total kWh": [_energies(v, g) for v, g in zip(frame["total_kwh"], growing, strict=True)],
        "kg CO2e": [_energies(v, g, kg_per_kwh) if kg_per_kwh is not None else display_text.MISSING
                    for v, g in zip(frame["total_kwh"], growing, strict=True)],
    })


_COLUMNS = {
    "start": st.column_config.DatetimeColumn("start (UTC)", format="YYYY-MM-DD HH:mm:ss", timezone="UTC"),
    "end": st.column_config.DatetimeColumn("end (UTC)", format="YYYY-MM-DD HH:mm:ss", timezone="UTC"),
    "duration s": st.column_config.NumberColumn(format="%.0f"),
    "samples/s": st.column_config.NumberColumn(format="%.1f"),
    "GPU kWh": st.column_config.TextColumn(help="the GPUs' energy; ≥: the running epoch's so far"),
    "J": st.column_config.NumberColumn(format="%.0f", help="the GPUs' energy in joules"),
    "J/sample": st.column_config.NumberColumn(format="%.3g"),
    "mean W": st.column_config.NumberColumn(format="%.0f", help="energy over duration, all the job's GPUs"),
    "method": st.column_config.TextColumn(help="counter: the GPUs' energy counters; power integral: GPUs "
                                               "without one, their power integrated over time"),
    "node kWh": st.column_config.TextColumn(help="the job's share of its nodes' power beside GPUs"),
    "total kWh": st.column_config.TextColumn(help="the GPUs' and the nodes' share"),
    "kg CO2e": st.column_config.TextColumn(help="total kWh × PUE × the job's carbon intensity"),
}
J_PER_KWH = 3.6e6


def epoch_chart(frame: pd.DataFrame) -> alt.Chart:
    """A bar per epoch spanning its time on the page's one UTC axis, as high as its energy."""
    shown = frame.assign(label=[f"epoch {e}" for e in frame["epoch"]],
                         state=["still growing" if g else "done" for g in frame["growing"]],
                         kwh=[_energies(v, g) for v, g in zip(frame["energy_kwh"], frame["growing"], strict=True)])
    chart: alt.Chart = alt.Chart(shown).mark_rect(stroke="white", strokeWidth=1).encode(
        x=charts.time_x(None, "start"), x2="end:T", y=alt.Y("energy_kwh:Q", title="energy (kWh)"),
        color=alt.Color("state:N", title="", scale=alt.Scale(domain=["done", "still growing"],
                                                             range=["#4c78a8", "#9ecae9"])),
        tooltip=["label:N", charts.time_tooltip("start", "start"), charts.time_tooltip("end", "end"),
                 alt.Tooltip("kwh:N", title="kWh"),  # the table's and the metrics' text, not a d3 format
                 alt.Tooltip("j_per_sample:Q", title="J/sample", format=".3g"),
                 alt.Tooltip("samples_per_s:Q", title="samples/s", format=".1f"), "method:N"],
    ).properties(height=180, title="Energy per epoch")
    return chart


def _outside(answer: dict[str, Any]) -> str:
    parts = []
    for key, what in (("before_first_epoch", "before the first epoch (start-up)"),
                      ("after_last_step", "after the last step")):
        span = answer[key]
        if span is not None and span["energy_kwh"] is not None:
            parts.append(f"{what}: {display_text.energy(span['energy_kwh'], growing=bool(span['growing']))} over "
                         f"{display_text.duration(span['duration_s'])}")
    return ("Also " + "; ".join(parts) + ". With the epochs they add up to the job's energy.") if parts else ""


def _whole(ref: data.JobRef, running: bool) -> float | None:
    """The whole job's energy and emissions; returns its kg CO2e per kWh (``None``: not configured)."""
    energy = data.energy(ref)
    emissions = energy["emissions"] or {}
    cells = st.columns(4)
    for cell, (label, value, unit) in zip(cells, (
            ("Energy, whole job", energy["total_kwh"], "kWh"), ("GPUs", energy["gpu_kwh"], "kWh"),
            ("Rest of the nodes", energy["node_kwh"], "kWh"), ("Emissions", emissions.get("co2e_kg"), "kg CO2e")),
            strict=True):
        # The report's figures (jobsight/rules/display_text.py): five significant digits, ≥ while running.
        cell.metric(f"{label} ({unit})", display_text.energy(value, growing=running, unit=False),
                    help="The job is running: this is still growing." if running and value is not None else None)
    st.caption(f"Rest of the nodes: {energy_text.node_method(energy['node'])}. "
               f"Emissions: {energy_text.emissions_method(energy['emissions'])}.")
    co2e, total = emissions.get("co2e_kg"), energy["total_kwh"]
    return co2e / total if co2e is not None and total else None


def _section(ref: data.JobRef, running: bool) -> None:
    st.subheader("Energy and emissions")
    kg_per_kwh = _whole(ref, running)
    st.subheader("Energy per epoch")
    answer = data.epochs(ref, running)
    if answer["energy_kwh"] is None:
        st.info("No GPU energy for this job yet: no GPU sample with an energy counter or a power reading.")
        return
    # The GPUs' energy is said once, above ("GPUs"): the epochs' own sum, read another way, would
    # differ in its last digit and show two figures for one thing.
    cells = st.columns(2)
    cells[0].metric("Method", answer["method"])
    cells[1].metric("Epochs", len(answer["epochs"]))
    st.caption(_method_note(answer))
    if not answer["epochs"]:
        st.info("No epochs: the job's training steps carry no epoch (or it has no jobsight callback).")
        return
    frame = _frame(answer["epochs"])
    tables.show(_table(frame, kg_per_kwh), column_config=_COLUMNS)
    st.caption(" ".join(filter(None, [
        "An epoch runs from its first step to the next epoch's; the last one to the last step.",
        _outside(answer),
        f"Figures marked “{GROWING}” belong to the running job: they will still grow." if running else "",
    ])))
    vega.show(epoch_chart(frame), charts.element_px(180, [charts.legend_px(2)]))
