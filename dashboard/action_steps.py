"""How a waste policy's step reads on the dashboard: "first warning", "cancelled", "would have
cancelled (dry run)", "exempt: interactive (no batch script)", "held back (hourly cap)", "failed: …".

A step is one row of ``actions`` (collector/store/schema.py): its ``step`` (warn, warn_again, act,
exempt), its ``outcome`` (recorded, pending, done, failed, held_back), whether it was a ``dry_run``,
its ``detail`` (the reason given to Slurm, why the job is exempt, or what the command said) and its
``evidence``, whose ``action`` is the policy's (cancel, requeue or notify-only). Pure, so that the
job page and the Actions page word a step the same way, and so it is tested without Streamlit. The
text returned is plain text: a page that puts it into Markdown passes it through
:func:`jobsight.dashboard.markup.plain`, since ``detail`` may hold a job's partition or Slurm's words.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

WARNINGS: Final = {"warn": "first warning", "warn_again": "second warning"}
DONE: Final = {"cancel": "cancelled", "requeue": "requeued"}
"""An action that went through, by the policy's action."""
UNDER_WAY: Final = {"cancel": "cancelling", "requeue": "requeueing"}
"""An action recorded as pending: its command is running, or the collector died while it ran (retried)."""
STEPS: Final = ("warn", "warn_again", "act", "exempt")
OUTCOMES: Final = ("recorded", "pending", "done", "failed", "held_back")
STEP_LABEL: Final = {"warn": "first warning", "warn_again": "second warning", "act": "action", "exempt": "exemption"}
"""A step's name in a filter, where the outcome is not known yet."""
OUTCOME_LABEL: Final = {"recorded": "recorded", "pending": "under way", "done": "done", "failed": "failed",
                        "held_back": "held back (hourly cap)"}


def _action(row: Mapping[str, Any]) -> str | None:
    """The policy's action, from the step's evidence (the one place the table keeps it)."""
    evidence = row.get("evidence")
    action = evidence.get("action") if isinstance(evidence, Mapping) else None
    return action if isinstance(action, str) else None


def _detail(row: Mapping[str, Any]) -> str:
    detail = row.get("detail")
    return detail.strip() if isinstance(detail, str) else ""


def _act_words(row: Mapping[str, Any]) -> str:
    """An ``act`` step: what happened to the job, or would have in a dry run."""
    action, outcome = _action(row), row.get("outcome")
    if action == "notify-only":
        # Nothing is run for such a policy, dry or not: its last step is a final notice.
        return "final notice (the policy only notifies)"
    done = DONE.get(action or "", "acted on")
    if row.get("dry_run"):
        return f"would have {done} (dry run)"
    if outcome == "held_back":
        return "held back (hourly cap)"
    if outcome == "failed":
        return f"failed: {_detail(row) or 'no reason given'}"
    if outcome == "pending":
        return UNDER_WAY.get(action or "", "acting")
    return done


def words(row: Mapping[str, Any]) -> str:
    """What the step was, in words."""
    step = str(row.get("step"))
    if step in WARNINGS:
        return WARNINGS[step] + (" (dry run)" if row.get("dry_run") else "")
    if step == "exempt":
        detail = _detail(row)
        return f"exempt: {detail}" if detail else "exempt"
    if step == "act":
        return _act_words(row)
    return step  # a step this dashboard does not know yet: its name as stored


def note(row: Mapping[str, Any]) -> str | None:
    """The step's detail where :func:`words` does not already say it (the reason a warning or an
    action gave, the cap that held an action back); ``None`` when there is nothing more to say."""
    detail = _detail(row)
    return detail if detail and detail not in words(row) else None
