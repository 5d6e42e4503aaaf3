"""Actions (admins): what the waste policies did across the cluster — jobs warned, cancelled or
requeued, what a dry run would have done, actions held back by the hourly cap or refused by Slurm,
jobs exempted — counted per user and per account, and every step listed, newest first, each opening
its job's page."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import streamlit as st

from jobsight.collector.config.actions import load_action_settings
from jobsight.collector.config.toml_settings import SettingsError
from jobsight.dashboard import action_steps, data, tables, url_state
from jobsight.dashboard.identity import viewer_or_stop
from jobsight.dashboard.settings import dashboard_settings
from jobsight.dashboard.url_state import Param
from jobsight.rules import display_text, links

settings = dashboard_settings()
viewer = viewer_or_stop(settings)
st.title("Actions")
if not viewer.is_admin:
    st.error("The actions across jobs are for admins only.")
    st.stop()

RANGES = {"last 24 hours": dt.timedelta(days=1), "last 7 days": dt.timedelta(days=7),
          "last 30 days": dt.timedelta(days=30), "all time": None}
RANGE_TOKENS = {"1d": "last 24 hours", "7d": "last 7 days", "30d": "last 30 days", "all": "all time"}
STEP_OPTIONS = ["any", *action_steps.STEPS]
OUTCOME_OPTIONS = ["any", *action_steps.OUTCOMES]
# The filters in the address: /actions?user=bob&account=ml&step=act&outcome=held_back&range=30d (each
# left out at its default), so that an admin can send the list they are looking at.
FILTERS = [
    Param("user", "actions_user", "", str),
    Param("account", "actions_account", "", str),
    Param("step", "actions_step", "any", url_state.choice(STEP_OPTIONS)),
    Param("outcome", "actions_outcome", "any", url_state.choice(OUTCOME_OPTIONS)),
    Param("range", "actions_range", "last 7 days", url_state.token_choice(RANGE_TOKENS),
          url_state.token_text(RANGE_TOKENS)),
]
url_state.restore(FILTERS)
cells = st.columns(5)
user = cells[0].text_input("User", key="actions_user").strip() or None
account = cells[1].text_input("Account", key="actions_account").strip() or None
step = cells[2].selectbox("Step", STEP_OPTIONS, key="actions_step",
                          format_func=lambda s: action_steps.STEP_LABEL.get(s, s))
outcome = cells[3].selectbox("Outcome", OUTCOME_OPTIONS, key="actions_outcome",
                             format_func=lambda o: action_steps.OUTCOME_LABEL.get(o, o))
period = cells[4].selectbox("Time range", list(RANGES), key="actions_range")
url_state.store(FILTERS)

span = RANGES[period]
# Whole minutes: the reads are cached by their arguments, and a start that moved every rerun would miss.
since = (dt.datetime.now(dt.UTC) - span).replace(second=0, microsecond=0) if span else None

COUNT_LABELS = {"jobs": "jobs", "warnings": "warnings", "cancelled": "cancelled", "requeued": "requeued",
                "dry_run": "would have acted (dry run)", "notify_only": "final notices (notify-only)",
                "held_back": "held back (hourly cap)", "failed": "failed", "exempt": "exempt"}
COUNT_HELP = {"jobs": "jobs with any step", "warnings": "first and second warnings",
              "dry_run": "would have acted: what dry-run policies would have cancelled or requeued",
              "held_back": "actions over the hourly cap, still waiting (tried again each pass)",
              "failed": "actions Slurm refused (the step's detail says why)"}


def _totals(by_user: pd.DataFrame) -> None:
    """The counts over every user: a job has one user, so the rows add up without counting one twice."""
    sums = {name: int(by_user[name].sum()) if not by_user.empty else 0 for name in COUNT_LABELS}
    row = st.columns(7)
    row[0].metric("Jobs", sums["jobs"], help=COUNT_HELP["jobs"])
    row[1].metric("Warnings", sums["warnings"], help=COUNT_HELP["warnings"])
    row[2].metric("Cancelled or requeued", sums["cancelled"] + sums["requeued"])
    # Short labels, the words in their help: seven figures in a row leave each about 150 pixels, which cut
    # "Would have acted (dry run)" and "Held back (hourly cap)" (tests/dashboard/test_demo_browser.py).
    row[3].metric("Dry run", sums["dry_run"], help=COUNT_HELP["dry_run"])
    row[4].metric("Held back", sums["held_back"], help=COUNT_HELP["held_back"])
    row[5].metric("Failed", sums["failed"], help=COUNT_HELP["failed"])
    row[6].metric("Exempt", sums["exempt"])


# Where a site reads how to set a waste policy. (A comment: a page's bare string is drawn by Streamlit's magic.)
POLICY_DOC = "docs/health.md, section “Acting on waste”"


def _policies() -> list[str] | None:
    """The waste policies this dashboard's settings name (the collector's ``[actions]`` table of the
    same ``JOBSIGHT_CONFIG``, or ``JOBSIGHT_ACTIONS_POLICIES``), each as ``name (rule, dry run)``;
    ``None`` when those settings cannot be read here (the message is the collector's to show)."""
    try:
        settings = load_action_settings()
    except SettingsError:
        return None
    return [f"{p.name} ({p.rule}, {'dry run' if p.dry_run else p.action})" for p in settings.policies]


def why_empty(policies: list[str] | None, period: str) -> str:
    """What an Actions page with no step means, and what would fill it."""
    if policies == []:
        return ("No waste policy is set, so jobsight has warned, cancelled or requeued nothing. A policy (warn "
                "the user twice, then cancel or requeue a job whose GPUs stay idle) is a `[[actions.policies]]` "
                f"entry in the collector's `JOBSIGHT_CONFIG` file or `JOBSIGHT_ACTIONS_POLICIES`: see {POLICY_DOC}. "
                "Start with `dry_run = true`: its steps show here without touching a job.")
    named = f"Policies set: {', '.join(policies)}. " if policies else ""
    return (f"{named}No policy took a step in the {period}: no job's finding has lasted until a policy's "
            "first warning, or the policies' filters leave every job out. Widen the time range to see older "
            f"steps; {POLICY_DOC} says what a policy goes by.")


def _counts(frame: pd.DataFrame, label: str) -> None:
    if frame.empty:
        st.info("No steps in this period.")
        return
    config = {name: st.column_config.NumberColumn(text, help=COUNT_HELP.get(name)) for name, text in
              COUNT_LABELS.items()}
    # No name: a job run outside Slurm (no prolog named its user) or one whose row is gone.
    named = frame.assign(name=[display_text.group_name(n) for n in frame["name"]])
    tables.show(named.rename(columns={"name": label}), column_config=config)


def _steps_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The listed steps: a link to the job, when, whose, which policy, what it was and its detail. Data
    frames show text as it is (no Markdown), so a job's name or Slurm's words need no escaping here."""
    rows = frame.to_dict("records")
    return pd.DataFrame({
        "open": [links.job_link(r["cluster"], r["job_id"]) for r in rows],
        "at": [r["at"] for r in rows],
        "job": [r["job_id"] for r in rows],
        "user": [display_text.group_name(r["user_name"]) for r in rows],
        "account": [display_text.group_name(r["account"]) for r in rows],
        "policy": [r["policy"] for r in rows],
        "what": [action_steps.words(r) for r in rows],
        "detail": [action_steps.note(r) or "" for r in rows],
        "job name": [r["job_name"] for r in rows],
    })


by_user = data.action_counts(viewer, "user_name", cluster=settings.cluster, user=user, account=account, since=since)
_totals(by_user)
if by_user.empty:
    st.info(why_empty(_policies(), period), icon=":material/policy:")
st.caption("Counts follow the user, account and time range above (not the step and outcome). A step is one per "
           "finding and policy: a job idle twice is warned on each idle spell.")
user_tab, account_tab = st.tabs(["By user", "By account"])
with user_tab:
    _counts(by_user, "user")
with account_tab:
    _counts(data.action_counts(viewer, "account", cluster=settings.cluster, user=user, account=account, since=since),
            "account")

st.subheader("Steps")
steps, total = data.actions(viewer, cluster=settings.cluster, user=user, account=account,
                            step=None if step == "any" else step, outcome=None if outcome == "any" else outcome,
                            since=since)
if steps.empty:
    st.info("No steps match these filters.")
    st.stop()
shown = f"showing the newest {len(steps)}" if total > len(steps) else f"showing {len(steps)}"
st.caption(f"{total} step(s) match; {shown}. “open” opens the job's page, where its steps are in its timeline.")
tables.show(_steps_table(steps), column_config={
    "open": st.column_config.LinkColumn("open", display_text="open"),
    "at": st.column_config.DatetimeColumn("at (UTC)", format="YYYY-MM-DD HH:mm", timezone="UTC"),
})
