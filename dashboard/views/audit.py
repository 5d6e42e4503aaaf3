"""Audit (admins): GPU-hours by user, account and partition, with those of jobs ended at their time
limit and of cancelled jobs; idle and low-utilisation allocations; energy and its share; the daily
trend; every table as CSV."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import streamlit as st

from jobsight.dashboard import charts, csv_export, data, tables, url_state, vega
from jobsight.dashboard.identity import viewer_or_stop
from jobsight.dashboard.settings import dashboard_settings
from jobsight.dashboard.url_state import Param
from jobsight.rules import display_text, links

settings = dashboard_settings()
viewer = viewer_or_stop(settings)
st.title("Audit")
if not viewer.is_admin:
    st.error("The audit is for admins only.")
    st.stop()

today = dt.datetime.now(dt.UTC).date()
WIDER_DAYS = 30


def _widen() -> str:
    """How to see more: the address of the last 30 days (the demo's history, a month of a site's jobs)."""
    wider = links.audit_link(today - dt.timedelta(days=WIDER_DAYS - 1), today)
    return f"[the last {WIDER_DAYS} days]({wider})"


# The period and thresholds in the address: /audit?from=2024-03-04&to=2024-03-05&low=30&idle=5 (the
# days always, so that a copied address keeps its period; a threshold only when not the setting's).
PARAMS = [
    Param(links.FROM, "audit_from", today - dt.timedelta(days=6), url_state.day, url_state.day_text, always=True),
    Param(links.TO, "audit_to", today, url_state.day, url_state.day_text, always=True),
    Param("low", "audit_low", settings.low_util_percent, url_state.percent, url_state.percent_text),
    Param("idle", "audit_idle", settings.idle_util_percent, url_state.percent, url_state.percent_text),
]
url_state.restore(PARAMS)
cells = st.columns(4)
first_day = cells[0].date_input("From (UTC)", key="audit_from")
last_day = cells[1].date_input("To (UTC, inclusive)", key="audit_to")
low = cells[2].number_input("Low utilisation below (%)", 0.0, 100.0, step=5.0, key="audit_low")
idle = cells[3].number_input("Idle below (%)", 0.0, 100.0, step=1.0, key="audit_idle")
url_state.store(PARAMS)
if last_day < first_day:
    st.error("The period ends before it starts.")
    st.stop()
start = dt.datetime.combine(first_day, dt.time(), dt.UTC)
end = dt.datetime.combine(last_day + dt.timedelta(days=1), dt.time(), dt.UTC)

report = data.audit(viewer, start, end, cluster=settings.cluster, low_util_percent=low, idle_util_percent=idle)
totals = report["totals"]
row = st.columns(4)
row[0].metric("Jobs", totals["jobs"])
growing = bool(totals.get("running_jobs"))
# The figures as the job pages and the report print them (jobsight/rules/display_text.py).
row[1].metric("GPU-hours", display_text.gpu_hours(totals["gpu_hours"], growing=growing))
row[2].metric("Energy (kWh)", display_text.energy(totals["energy_kwh"], growing=growing, unit=False),
              help=f"{totals['running_jobs']} running job(s) counted with their energy so far: still growing."
              if growing else None)
row[3].metric("Mean GPU utilisation", display_text.percent(totals["mean_util"]))
# Where most allocated GPU-hours are wasted: jobs Slurm killed at their time limit, and cancelled jobs.
ended = st.columns(4)
ended[0].metric("GPU-hours ended by time limit", display_text.gpu_hours(totals["timeout_gpu_hours"]),
                help="GPU-hours of jobs that Slurm ended at their time limit (state TIMEOUT)")
ended[1].metric("GPU-hours of cancelled jobs", display_text.gpu_hours(totals["cancelled_gpu_hours"]),
                help="GPU-hours of jobs cancelled with scancel (state CANCELLED)")
whole, co2e = totals.get("total_energy_kwh"), totals.get("co2e_kg")
ended[2].metric("Energy, whole jobs (kWh)", display_text.energy(whole, growing=growing, unit=False),
                help="the GPUs' and the jobs' share of their nodes' power beside the GPUs (RAPL, IPMI or Redfish)")
ended[3].metric("Emissions (kg CO2e)", display_text.co2e(co2e, growing=growing, unit=False),
                help="ended jobs: at the carbon intensity of the hours they ran, with the PUE; running jobs: "
                     "their energy so far at the site's yearly figure")
st.caption("GPU-hours count each job's allocated GPUs over the part of its run inside the period. Energy comes "
           "from finished jobs' summaries, pro-rated the same way, and from running jobs' GPUs so far: a row that "
           "counts running jobs (column *running*) is marked “≥ still growing”.")

period = f"{first_day:%Y%m%d}-{last_day:%Y%m%d}"
days = (last_day - first_day).days + 1
days_text = f"the {days} day(s) from {first_day:%Y-%m-%d} to {last_day:%Y-%m-%d} (UTC)"
if not totals["jobs"]:
    st.info(f"No job ran in {days_text}. Widen the period with *From* above, or open {_widen()}.")


def _table(frame: pd.DataFrame, name: str, *, job_links: bool = False, empty: str = "") -> None:
    if frame.empty:
        st.info(empty or f"Nothing in {days_text}. Widen the period with *From* above, or open {_widen()}.")
        return
    shown = frame.copy()
    if "state" in shown:
        shown["state"] = [display_text.state(s) for s in shown["state"]]
    if "flags" in shown:
        shown["flags"] = [", ".join(map(display_text.flag_label, f)) if isinstance(f, list) else ""
                          for f in shown["flags"]]
    # A job whose prolog never named its user, account or partition: "unknown", never a "None" row.
    for column in ("user_name", "user", "account", "partition"):
        if column in shown:
            shown[column] = [display_text.group_name(v) for v in shown[column]]
    # Numbers stay numbers, so that a column sorts (who used most); each energy column has the decimals
    # display_text gives its largest figure, which then reads as the metrics above and the report print it.
    figures = {name: display_text.figure_format(shown[name]) if name in shown else "%.3f"
               for name in ("energy_kwh", "node_energy_kwh", "total_energy_kwh", "co2e_kg")}
    config = {"gpu_hours": st.column_config.NumberColumn("GPU-hours", format="%.2f"),
              "low_util_gpu_hours": st.column_config.NumberColumn("low-util GPU-hours", format="%.2f"),
              "mean_util": st.column_config.NumberColumn("mean util %", format="%.0f"),
              "energy_kwh": st.column_config.NumberColumn("GPU kWh", format=figures["energy_kwh"]),
              "energy_share": st.column_config.NumberColumn("energy share", format="percent"),
              "node_energy_kwh": st.column_config.NumberColumn(
                  "node kWh", format=figures["node_energy_kwh"],
                  help="the jobs' share of their nodes' power beside the GPUs"),
              "total_energy_kwh": st.column_config.NumberColumn("total kWh", format=figures["total_energy_kwh"]),
              "co2e_kg": st.column_config.NumberColumn("kg CO2e", format=figures["co2e_kg"]),
              "running_jobs": st.column_config.NumberColumn(
                  "running", help="jobs still running: their energy so far is counted, and still growing"),
              "timeout_gpu_hours": st.column_config.NumberColumn(
                  "GPU-hours TIMEOUT", format="%.2f", help="of jobs Slurm ended at their time limit"),
              "cancelled_gpu_hours": st.column_config.NumberColumn(
                  "GPU-hours CANCELLED", format="%.2f", help="of jobs cancelled with scancel"),
              "end_reason": st.column_config.TextColumn(
                  "ended by jobsight", help="the waste policy's reason, when jobsight cancelled the job"),
              "day": st.column_config.DatetimeColumn("day (UTC)", format="YYYY-MM-DD", timezone="UTC"),
              "start_time": st.column_config.DatetimeColumn("started (UTC)", format="YYYY-MM-DD HH:mm",
                                                            timezone="UTC"),
              "end_time": st.column_config.DatetimeColumn("ended (UTC)", format="YYYY-MM-DD HH:mm",
                                                          timezone="UTC")}
    if "running_jobs" in shown:
        shown.insert(shown.columns.get_loc("energy_kwh") + 1, "energy note",
                     ["≥ still growing" if n else "" for n in shown["running_jobs"]])
    if job_links:
        shown.insert(0, "open", [links.job_link(c, j) for c, j in zip(shown["cluster"], shown["job_id"], strict=True)])
        config["open"] = st.column_config.LinkColumn("open", display_text="open")
    tables.show(shown, column_config=config)
    # The data as they are, for a spreadsheet or a script: the table's headers, empty unknowns, ISO
    # days and UTC times, Slurm's states, numbers unrounded (dashboard/csv_export.py).
    st.download_button(f"CSV: {name}", csv_export.csv_bytes(frame, column_config=config),
                       file_name=f"jobsight-{name}-{period}.csv", mime="text/csv", key=f"csv_{name}")


st.subheader("GPU-hours and energy")
for tab, (group, label) in zip(st.tabs(["By user", "By account", "By partition"]),
                               (("user_name", "user"), ("account", "account"), ("partition", "partition")),
                               strict=True):
    with tab:
        _table(report[group].rename(columns={"name": label}), f"by-{label}")

st.subheader("Idle and low-utilisation allocations")
idle_tab, low_tab = st.tabs([f"Idle (< {idle:.0f} %)", f"Low (< {low:.0f} %)"])
with idle_tab:
    _table(report["idle"], "idle", job_links=True,
           empty=f"No ended job's GPUs idled (mean under {idle:.0f} %) in {days_text}. Waste of older jobs is outside "
                 f"it: widen the period with *From* above, or open {_widen()}.")
with low_tab:
    _table(report["low"], "low-utilisation", job_links=True,
           empty=f"No ended job ran under {low:.0f} % GPU utilisation in {days_text}. Waste of older jobs is "
                 f"outside it: widen the period with *From* above, or open {_widen()}.")

st.subheader("Trend")
trend = report["trend"]
if trend.empty or not trend["gpu_hours"].any():
    st.info(f"No GPU-hours in {days_text}. Widen the period with *From* above, or open {_widen()}.")
else:
    vega.show(charts.trend_chart(trend))
_table(trend, "daily-trend")
