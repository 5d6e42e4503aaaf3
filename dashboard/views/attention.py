"""Attention (admins): the open findings across the cluster, most severe first, filterable by rule
and severity, each opening its job page at the moment it points at."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import streamlit as st

from jobsight.dashboard import data, tables, url_state
from jobsight.dashboard.identity import viewer_or_stop
from jobsight.dashboard.settings import dashboard_settings
from jobsight.dashboard.url_state import Param
from jobsight.dashboard.views.job_health import RULE_LABEL, SEVERITY_MARK, SEVERITY_ORDER, moment_of, moment_url
from jobsight.rules import display_text
from jobsight.rules.rule_names import RULES

settings = dashboard_settings()
viewer = viewer_or_stop(settings)
st.title("Attention")
if not viewer.is_admin:
    st.error("The Attention view is for admins only.")
    st.stop()

RULE_OPTIONS = ["any", *RULES]
SEVERITY_OPTIONS = ["any", *SEVERITY_ORDER]
# The filters in the address: /attention?rule=hung_rank&severity=critical (left out at "any").
FILTERS = [Param("rule", "attention_rule", "any", url_state.choice(RULE_OPTIONS)),
           Param("severity", "attention_severity", "any", url_state.choice(SEVERITY_OPTIONS))]
url_state.restore(FILTERS)
cells = st.columns(2)
rule = cells[0].selectbox("Rule", RULE_OPTIONS, key="attention_rule",
                          format_func=lambda r: r if r == "any" else f"{RULE_LABEL.get(r, r)} ({r})")
severity = cells[1].selectbox("Severity", SEVERITY_OPTIONS, key="attention_severity")
url_state.store(FILTERS)


def _table(frame: pd.DataFrame) -> pd.DataFrame:
    rows = frame.to_dict("records")
    return pd.DataFrame({
        "open": [moment_url(r["cluster"], r["job_id"], moment_of(r)) for r in rows],
        "severity": [f"{SEVERITY_MARK.get(r['severity'], '○')} {r['severity']}" for r in rows],
        # The rule in the job page's words; its setting name (hung_rank) is in the Rule filter.
        "rule": [RULE_LABEL.get(r["rule"], r["rule"]) for r in rows],
        "job": [r["job_id"] for r in rows],
        "subject": [r["subject"] or "job" for r in rows],
        # As the jobs list words them (jobsight/rules/display_text.py): "unknown" before a prolog, the process's
        # owner for a run outside Slurm (its partition "n/a").
        "user": [display_text.user(r) for r in rows],
        "account": [display_text.account(r) for r in rows],
        "partition": [display_text.partition(r) for r in rows],
        "since": [r["opened_at"] for r in rows],
        "title": [r["title"] for r in rows],
    })


@st.fragment(run_every=dt.timedelta(seconds=settings.refresh_s))
def open_findings() -> None:
    frame, total = data.attention(viewer, cluster=settings.cluster, rule=None if rule == "any" else rule)
    counts = frame["severity"].value_counts() if not frame.empty else pd.Series(dtype=int)
    row = st.columns(3)
    for cell, level in zip(row, SEVERITY_ORDER, strict=True):
        cell.metric(level.capitalize(), int(counts.get(level, 0)))
    if severity != "any":
        frame = frame[frame["severity"] == severity]
    if frame.empty:
        st.success("Nothing needs attention: no open finding matches these filters.")
        return
    shown = f"showing the {len(frame)} most severe" if total > data.ATTENTION_LIMIT else f"showing {len(frame)}"
    st.caption(f"{total} open finding(s) for this rule filter; {shown}. “open” opens the job page at the moment "
               "the finding points at.")
    tables.show(_table(frame), column_config={
        "open": st.column_config.LinkColumn("open", display_text="open"),
        "since": st.column_config.DatetimeColumn("since (UTC)", format="YYYY-MM-DD HH:mm", timezone="UTC"),
        "subject": st.column_config.TextColumn(help="what in the job: the whole job, or a rank"),
    })


open_findings()
