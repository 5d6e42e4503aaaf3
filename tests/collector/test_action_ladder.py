"""The ladder of a waste policy, decided from facts: warnings then the action, in order, one a pass;
exemptions; no step on a telemetry gap; a recovered job's new finding starts again."""

from __future__ import annotations

import datetime as dt

import pytest

from jobsight.collector.config.actions import load_action_settings
from jobsight.collector.config.toml_settings import SettingsError
from jobsight.collector.passes.action_ladder import (
    ACT,
    EXEMPT,
    WARN,
    WARN_AGAIN,
    Candidate,
    JobFacts,
    due_step,
    duration_words,
    reason,
)

NOW = dt.datetime(2026, 11, 24, 12, tzinfo=dt.UTC)
STALE = dt.timedelta(minutes=5)
POLICY = {"name": "gpu-idle", "rule": "idle_allocation", "warn_after_s": 600, "warn_again_after_s": 1200,
          "act_after_s": 1800, "action": "cancel", "dry_run": False, "partitions": ["gpu"],
          "exempt_accounts": ["ood"], "interactive_names": ["sys/dashboard/sys/jupyter"], "exempt_comment": "keep-me"}


def policy(**changes: object) -> object:
    return load_action_settings(policies=[{**POLICY, **changes}]).policies[0]


def idle_for(minutes: float, *, last_sample_s: float | None = 30, **job: object) -> Candidate:
    facts = JobFacts(**{"job_id": "42", "user": "alice", "account": "proj", "partition": "gpu", "batch": True,
                        **job})  # type: ignore[arg-type]
    last = None if last_sample_s is None else NOW - dt.timedelta(seconds=last_sample_s)
    return Candidate(7, "idle_allocation", NOW - dt.timedelta(minutes=minutes), last, facts)


def test_the_ladder_goes_one_step_a_pass_in_order() -> None:
    p = policy()
    assert due_step(p, idle_for(5), set(), NOW, STALE) is None
    assert due_step(p, idle_for(11), set(), NOW, STALE) == WARN
    # Long past every step (a collector that was down): still the first warning first.
    assert due_step(p, idle_for(300), set(), NOW, STALE) == WARN
    assert due_step(p, idle_for(300), {WARN}, NOW, STALE) == WARN_AGAIN
    assert due_step(p, idle_for(25), {WARN, WARN_AGAIN}, NOW, STALE) is None
    assert due_step(p, idle_for(31), {WARN, WARN_AGAIN}, NOW, STALE) == ACT
    assert due_step(p, idle_for(31), {WARN, WARN_AGAIN, ACT}, NOW, STALE) is None


def test_a_telemetry_gap_is_not_idleness() -> None:
    p = policy()
    assert due_step(p, idle_for(60, last_sample_s=None), {WARN, WARN_AGAIN}, NOW, STALE) is None
    assert due_step(p, idle_for(60, last_sample_s=301), {WARN, WARN_AGAIN}, NOW, STALE) is None
    assert due_step(p, idle_for(60, last_sample_s=299), {WARN, WARN_AGAIN}, NOW, STALE) == ACT


@pytest.mark.parametrize("job", [{"batch": False}, {"name": "sys/dashboard/sys/jupyter"}, {"account": "ood"},
                                 {"comment": "please keep-me running"}])
def test_exempt_jobs_get_one_exempt_step_and_nothing_else(job: dict[str, object]) -> None:
    p = policy()
    assert due_step(p, idle_for(60, **job), set(), NOW, STALE) == EXEMPT
    assert due_step(p, idle_for(60, **job), {EXEMPT}, NOW, STALE) is None


def test_filters_and_rule_choose_the_jobs() -> None:
    assert due_step(policy(), idle_for(60, partition="cpu"), set(), NOW, STALE) is None
    assert due_step(policy(partitions=[]), idle_for(60, partition="cpu"), set(), NOW, STALE) == WARN
    assert due_step(policy(rule="hung_rank"), idle_for(60), set(), NOW, STALE) is None


def test_the_reason_says_what_how_long_and_which_policy() -> None:
    assert reason(policy(), idle_for(120), NOW) == "jobsight: GPUs idle 2 h (policy gpu-idle)"
    assert (duration_words(45 * 60), duration_words(150 * 60)) == ("45 min", "2.5 h")


@pytest.mark.parametrize(("values", "named"), [
    ({"policies": [{**POLICY, "act_after_s": 900}]}, "JOBSIGHT_ACTIONS_POLICIES_0"),
    ({"policies": [{**POLICY, "rule": "straggler"}]}, "JOBSIGHT_ACTIONS_POLICIES_0_RULE"),
    ({"policies": [POLICY, POLICY]}, "two policies are named gpu-idle"),
    ({"policies": [{**POLICY, "name": "no spaces"}]}, "JOBSIGHT_ACTIONS_POLICIES_0_NAME"),
    ({"max_actions_per_hour": -1}, "JOBSIGHT_ACTIONS_MAX_ACTIONS_PER_HOUR"),
])
def test_bad_policies_are_named(values: dict[str, object], named: str) -> None:
    with pytest.raises(SettingsError, match=named):
        load_action_settings(**values)


def test_a_policy_is_a_dry_run_until_turned_on() -> None:
    assert load_action_settings(policies=[{k: v for k, v in POLICY.items() if k != "dry_run"}]).policies[0].dry_run
