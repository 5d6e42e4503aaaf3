"""The job page's "Actions" section: the steps waste policies took for the job, as a timeline
(when, which policy, what: a warning, the cancel or requeue, a dry run's would-have, an
exemption, an action held back by the hourly cap or refused by Slurm), oldest first.

Drawn only when the job has a step, so most jobs' pages do not change. Not a page of its own:
:mod:`jobsight.dashboard.views.job` calls :func:`show`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import streamlit as st

from jobsight.dashboard import action_steps, data
from jobsight.dashboard.markup import plain


def show(ref: data.JobRef, every: dt.timedelta | None) -> None:
    """The section, redrawn every ``every`` while the job runs (``None``: drawn once): a warning
    recorded while the page is open shows up without a reload."""
    st.fragment(_section, run_every=every)(ref)


def _when(at: dt.datetime) -> str:
    return f"{at.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC"


def line(row: Mapping[str, Any]) -> str:
    """One step as a Markdown list item. The policy's name, the words and the detail are plain()
    text: an exemption names the job's partition, a failure quotes Slurm."""
    said = f"**{_when(row['at'])}** · policy {plain(row['policy'])} · {plain(action_steps.words(row))}"
    extra = action_steps.note(row)
    return f"- {said}" + (f" — {plain(extra)}" if extra else "")


def timeline(rows: Sequence[Mapping[str, Any]]) -> str:
    """The steps, in the order given (oldest first), one list item each."""
    return "\n".join(line(row) for row in rows)


def _section(ref: data.JobRef) -> None:
    rows = data.job_actions(ref)
    if not rows:
        return
    st.subheader("Actions")
    st.markdown(timeline(rows))
    if any(row.get("dry_run") for row in rows):
        st.caption("A dry run records what its policy would do: it sends no warning and does nothing to the job.")
