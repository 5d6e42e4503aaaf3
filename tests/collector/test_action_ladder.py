"""The ladder of a waste policy, decided from facts: warnings then the action, in order, one a pass;
exemptions only by what the site controls (an interactive job within the time-limit cap, accounts only
where accounting enforces them); no step on a telemetry gap; the reason counts idle time from when the
GPUs went idle."""

from __future__ import annotations

import datetime as dt

import pytest

from jobsight.collector.config.actions import Policy, load_action_settings
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
    exemption,
    idle_since,
    reason,
)

NOW = dt.datetime(2026, 11, 24, 12, tzinfo=dt.UTC)
STALE = dt.timedelta(minutes=5)
POLICY = {"name": "gpu-idle", "rule": "idle_allocation", "warn_after_s": 600, "warn_again_after_s": 1200,
          "act_after_s": 1800, "action": "cancel", "dry_run": False, "partitions": ["gpu"],
          "exempt_accounts": ["ood"], "interactive_names": ["sys/dashboard/sys/jupyter"], "exempt_comment": "keep-me"}


def policy(**changes: object) -> Policy:
    return load_action_settings(policies=[{**POLICY, **changes}], accounts_enforced=True).policies[0]


def idle_for(minutes: float, *, last_sample_s: float | None = 30, idle_since: dt.datetime | None = None,
             **job: object) -> Candidate:
    facts = JobFacts(**{"job_id": "42", "user": "alice", "account": "proj", "partition": "gpu", "batch": True,
                        "time_limit_s": 4 * 3600, **job})  # type: ignore[arg-type]
    last = None if last_sample_s is None else NOW - dt.timedelta(seconds=last_sample_s)
    return Candidate(7, "idle_allocation", NOW - dt.timedelta(minutes=minutes), last, facts, idle_since)


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
    values = {k: v for k, v in POLICY.items() if k != "dry_run"}
    assert load_action_settings(policies=[values], accounts_enforced=True).policies[0].dry_run


@pytest.mark.parametrize("job", [{"batch": False}, {"name": "sys/dashboard/sys/jupyter"},
                                 {"partition": "interactive"}])
def test_an_interactive_job_is_exempt_only_within_the_time_limit_cap(job: dict[str, object]) -> None:
    """Any user can start a job without a batch script (``salloc --no-shell`` + ``srun``) or name a batch
    job like an app: exempt with a time limit up to the cap, warned like any other past it or with none."""
    p = policy(partitions=[], interactive_partitions=["interactive"], interactive_max_time_limit_s=8 * 3600)
    assert due_step(p, idle_for(60, time_limit_s=8 * 3600, **job), set(), NOW, STALE) == EXEMPT
    assert due_step(p, idle_for(60, time_limit_s=8 * 3600 + 60, **job), set(), NOW, STALE) == WARN
    assert due_step(p, idle_for(60, time_limit_s=None, **job), set(), NOW, STALE) == WARN
    assert due_step(policy(partitions=[], interactive_partitions=["interactive"], interactive_max_time_limit_s=600),
                    idle_for(60, time_limit_s=3600, **job), set(), NOW, STALE) == WARN


def test_the_default_cap_is_eight_hours() -> None:
    p = load_action_settings(policies=[{k: v for k, v in POLICY.items() if k != "exempt_accounts"}]).policies[0]
    assert p.interactive_max_time_limit_s == 8 * 3600
    assert exemption(p, JobFacts("42", batch=False, time_limit_s=8 * 3600)) == "interactive (no batch script)"
    assert exemption(p, JobFacts("42", batch=False, time_limit_s=24 * 3600)) is None


def test_exemptions_by_name_or_comment_say_they_are_the_users_word() -> None:
    p = policy()
    assert "the user's word" in (exemption(p, JobFacts("42", name="sys/dashboard/sys/jupyter", time_limit_s=60)) or "")
    assert "the user's word" in (exemption(p, JobFacts("42", comment="keep-me please")) or "")


@pytest.mark.parametrize("listed", [{"exempt_accounts": ["ood"]}, {"accounts": ["physics"]}])
def test_a_policy_listing_accounts_is_refused_unless_accounting_enforces_them(listed: dict[str, object]) -> None:
    """Without enforced associations a job's account is whatever its user typed at submission: an
    exemption by it is the user's choice, and a filter by it is one too. Refused at start-up, naming it."""
    values = {**{k: v for k, v in POLICY.items() if k != "exempt_accounts"}, **listed}
    with pytest.raises(SettingsError, match=f"policy gpu-idle lists {next(iter(listed))}.*accounts_enforced"):
        load_action_settings(policies=[values])
    assert load_action_settings(policies=[values], accounts_enforced=True).policies[0].name == "gpu-idle"


def test_the_reason_counts_from_when_the_gpus_went_idle() -> None:
    """docs/health.md's policy: the finding opens after 30 min idle and acts 2 h later; the job was idle 2.5 h."""
    went_idle = NOW - dt.timedelta(minutes=150)
    assert reason(policy(), idle_for(120, idle_since=went_idle), NOW) == "jobsight: GPUs idle 2.5 h (policy gpu-idle)"
    assert reason(policy(), idle_for(120), NOW) == "jobsight: GPUs idle 2 h (policy gpu-idle)"  # evidence silent


def test_idle_since_is_read_from_the_evidence_and_only_when_it_makes_sense() -> None:
    opened = NOW - dt.timedelta(hours=2)
    before = (opened - dt.timedelta(minutes=30)).timestamp()
    assert idle_since({"idle_since": before}, opened) == opened - dt.timedelta(minutes=30)
    assert idle_since({"idle_since": int(before)}, opened) is not None
    for bad in ("1700000000", True, float("nan"), float("inf"), (NOW + dt.timedelta(hours=1)).timestamp(), None):
        assert idle_since({"idle_since": bad}, opened) is None
    assert idle_since(None, opened) is None and idle_since({}, opened) is None
