"""What waste policies did, on the dashboard: the job page's "Actions" timeline and its end reason,
and the admins' Actions page with its counts per user and per account, over rows written with SQL
as the actions pass stores them (collector/passes/actions.py).

The cluster's steps, by job, all in the last two hours unless said (the policy's action is in each step's evidence):

| job   | user  | account | steps                                                            |
| act-1 | bob   | physics | warn, warn_again, act done (cancel); ended CANCELLED, end_reason |
| act-2 | alice | ml      | warn, warn_again, act: all a dry run (cancel)                    |
| act-3 | alice | ml      | warn, warn_again, act held back by the hourly cap                |
| act-4 | carol | ml      | exempt (interactive partition ood)                               |
| act-5 | bob   | physics | warn, warn_again, act failed (requeue)                           |
| act-7 | alice | ml      | warn, warn_again, act done (requeue)                             |
| act-6 | dave  | chem    | warn, ten days ago: outside the page's default week              |
| gone  | -     | -       | warn, of a job with no row                                       |

``quiet`` is bob's job without a step. A second cluster holds alice's job whose end reason,
policy name and details are Markdown and HTML (test_hostile_markup.py's approach).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from streamlit.testing.v1 import AppTest

from jobsight.collector.query.actions import action_counts, list_actions
from jobsight.dashboard import action_steps, data
from jobsight.dashboard.identity import Viewer
from jobsight.dashboard.views.job_actions import timeline
from tests.conftest import REPO
from tests.dashboard.conftest import texts
from tests.dashboard.header_facts import header_facts
from tests.dashboard.seed import Seed
from tests.dashboard.test_hostile_markup import markdown_sources, reading

UTC = dt.UTC
REASON = "jobsight: GPUs idle 2 h (policy gpu-idle)"
FAILED = f"{REASON}; scancel: Invalid job id specified"
CAP = "over the cap of 5 an hour"


@dataclass(frozen=True)
class Step:
    job: str
    step: str
    minutes_ago: float
    outcome: str = "recorded"
    dry_run: bool = False
    detail: str = REASON
    action: str = "cancel"
    policy: str = "gpu-idle"


# (job, user, account, state, end_reason)
JOBS = [("act-1", "bob", "physics", "cancelled", REASON), ("act-2", "alice", "ml", "running", None),
        ("act-3", "alice", "ml", "running", None), ("act-4", "carol", "ml", "running", None),
        ("act-5", "bob", "physics", "running", None), ("act-7", "alice", "ml", "requeued", None),
        ("act-6", "dave", "chem", "completed", None), ("quiet", "bob", "physics", "running", None)]


def _ladder(job: str, last: Step) -> list[Step]:
    """A first and a second warning before ``last``, as dry as it is."""
    return [Step(job, "warn", last.minutes_ago + 60, dry_run=last.dry_run, action=last.action),
            Step(job, "warn_again", last.minutes_ago + 30, dry_run=last.dry_run, action=last.action), last]


STEPS = [
    *_ladder("act-1", Step("act-1", "act", 20, outcome="done")),
    *_ladder("act-2", Step("act-2", "act", 15, dry_run=True)),
    *_ladder("act-3", Step("act-3", "act", 10, outcome="held_back", detail=CAP)),
    Step("act-4", "exempt", 50, detail="interactive partition ood"),
    *_ladder("act-5", Step("act-5", "act", 5, outcome="failed", detail=FAILED, action="requeue")),
    *_ladder("act-7", Step("act-7", "act", 25, outcome="done", action="requeue")),
    Step("act-6", "warn", 10 * 24 * 60),
    Step("gone", "warn", 24 * 60),
]


def _insert_job(conn: psycopg.Connection[Any], cluster: str, job: str, user: str, account: str, state: str,
                end_reason: str | None, name: str | None = None) -> None:
    now = dt.datetime.now(UTC).replace(microsecond=0)
    ended = None if state == "running" else now - dt.timedelta(minutes=19)
    conn.execute(
        """INSERT INTO jobs (cluster, job_id, user_name, account, partition, name, nodes, node_count, gpus,
                             start_time, end_time, state, exit_code, last_seen, end_reason)
           VALUES (%s, %s, %s, %s, 'gpu', %s, '{n1}', 1, '{n1:0}', %s, %s, %s, %s, %s, %s)""",
        (cluster, job, user, account, name or f"train-{job}", now - dt.timedelta(hours=12), ended, state,
         None if ended is None else 0, ended or now, end_reason))


def _insert_step(conn: psycopg.Connection[Any], cluster: str, step: Step, finding: int) -> None:
    conn.execute(
        """INSERT INTO actions (cluster, job_id, finding_id, policy, rule, step, at, dry_run, outcome, detail,
                                evidence)
           VALUES (%s, %s, %s, %s, 'idle_allocation', %s, now() - %s, %s, %s, %s, %s)""",
        (cluster, step.job, finding, step.policy, step.step, dt.timedelta(minutes=step.minutes_ago), step.dry_run,
         step.outcome, step.detail, Jsonb({"finding": {"util": 0}, "action": step.action})))


@pytest.fixture(scope="module")
def acted_seed(database_url: str) -> str:
    cluster = f"acts-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as conn, conn.transaction():
        for job, user, account, state, end_reason in JOBS:
            _insert_job(conn, cluster, job, user, account, state, end_reason)
        findings = {job: 1000 + index for index, (job, *_) in enumerate(JOBS)}
        for step in STEPS:
            _insert_step(conn, cluster, step, findings.get(step.job, 999))
    return cluster


@pytest.fixture
def acted(dashboard_env: Seed, acted_seed: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_CLUSTER", acted_seed)
    yield acted_seed


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def _timeline(at: AppTest) -> list[str]:
    """The Actions section's list items as a reader sees them, in order; [] when there is none."""
    if "Actions" not in [s.value for s in at.subheader]:
        return []
    [source] = [m.value for m in at.markdown if m.value.startswith("- **")]
    return [reading(item)[0] for item in source.split("\n")]


# -- the job page ------------------------------------------------------------------------------------


def test_the_job_page_shows_why_jobsight_cancelled_it_and_the_ladder(app_as: Callable[..., AppTest],
                                                                      acted: str) -> None:
    at = app_as("bob", "views/job.py", cluster=acted, job="act-1")
    _ok(at)
    assert header_facts(at)["State"] == "CANCELLED"
    [ended] = [i.value for i in at.info if "— jobsight" in i.value]
    assert reading(ended) == (f"CANCELLED — {REASON}", [])
    lines = _timeline(at)
    assert len(lines) == 3
    assert [line.split(" · ", 2)[1:] for line in lines] == [
        ["policy gpu-idle", f"first warning — {REASON}"],
        ["policy gpu-idle", f"second warning — {REASON}"],
        ["policy gpu-idle", f"cancelled — {REASON}"]]
    assert lines == sorted(lines)  # oldest first: each line starts with its time


@pytest.mark.parametrize(("user", "job", "last"), [
    ("alice", "act-2", f"would have cancelled (dry run) — {REASON}"),
    ("alice", "act-3", f"held back (hourly cap) — {CAP}"),
    ("alice", "act-7", f"requeued — {REASON}"),
    ("bob", "act-5", f"failed: {FAILED}"),
    ("carol", "act-4", "exempt: interactive partition ood"),
])
def test_each_step_reads_in_words(app_as: Callable[..., AppTest], acted: str, user: str, job: str,
                                  last: str) -> None:
    at = app_as(user, "views/job.py", cluster=acted, job=job)
    _ok(at)
    lines = _timeline(at)
    assert lines and lines[-1].split(" · ", 2)[2] == last
    dry = "A dry run records what its policy would do: it sends no warning and does nothing to the job."
    assert (dry in [c.value for c in at.caption]) == (job == "act-2")
    if job == "act-2":
        assert [line.split(" · ", 2)[2].split(" — ")[0] for line in lines] == [
            "first warning (dry run)", "second warning (dry run)", "would have cancelled (dry run)"]
    # Only act-1 was ended by jobsight: no other page says so.
    assert not [i.value for i in at.info if "— jobsight" in i.value]


def test_a_job_without_steps_has_no_actions_section(app_as: Callable[..., AppTest], acted: str) -> None:
    at = app_as("bob", "views/job.py", cluster=acted, job="quiet")
    _ok(at)
    assert "Actions" not in [s.value for s in at.subheader] and _timeline(at) == []
    assert "policy" not in texts(at)


def test_another_user_sees_none_of_a_jobs_steps(app_as: Callable[..., AppTest], acted: str) -> None:
    at = app_as("bob", "views/job.py", cluster=acted, job="act-2")
    _ok(at)
    said = texts(at)
    assert "not your job" in said
    for leak in ("Actions", "warning", "gpu-idle", "dry run"):
        assert leak not in said, leak


# -- the Actions page --------------------------------------------------------------------------------


def test_the_actions_page_counts_per_user_and_account(app_as: Callable[..., AppTest], acted: str) -> None:
    at = app_as("root", "views/actions.py")
    _ok(at)
    assert [t.value for t in at.title] == ["Actions"]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics == {"Jobs": "7", "Warnings": "11", "Cancelled or requeued": "2", "Dry run": "1",
                       "Held back": "1", "Failed": "1", "Exempt": "1"}
    # No bare string of the page script drawn by Streamlit's magic (a docstring once showed as a paragraph).
    assert not [m.value for m in at.markdown if "Where a site reads" in m.value]
    by_user, by_account, listed = (frame.value for frame in at.dataframe)
    assert list(by_user["user"]) == ["alice", "bob", "unknown", "carol"]  # acted on most, then warned most
    alice, bob = (by_user.set_index("user").loc[name] for name in ("alice", "bob"))
    assert alice[["jobs", "warnings", "requeued", "dry_run", "held_back", "cancelled"]].tolist() == [3, 6, 1, 1, 1, 0]
    assert bob[["jobs", "warnings", "cancelled", "failed", "requeued"]].tolist() == [2, 4, 1, 1, 0]
    accounts = by_account.set_index("account")
    assert (accounts.loc["ml", "jobs"], accounts.loc["ml", "exempt"], accounts.loc["physics", "cancelled"]) == (4, 1, 1)
    assert "chem" not in set(by_account["account"])  # dave's warning is ten days old
    assert len(listed) == 17


def test_the_actions_page_lists_steps_newest_first_each_opening_its_job(app_as: Callable[..., AppTest],
                                                                        acted: str) -> None:
    at = app_as("root", "views/actions.py")
    listed = at.dataframe[2].value
    assert list(listed["job"][:3]) == ["act-5", "act-3", "act-2"]
    assert list(listed["what"][:3]) == [f"failed: {FAILED}", "held back (hourly cap)", "would have cancelled (dry run)"]
    assert listed["detail"][1] == CAP
    assert listed["open"][0] == f"job?cluster={acted}&job=act-5"
    assert {"exempt: interactive partition ood", "cancelled", "requeued", "first warning"} <= set(listed["what"])


def test_the_actions_page_filters_and_keeps_them_in_the_address(app_as: Callable[..., AppTest], acted: str) -> None:
    at = app_as("root", "views/actions.py", step="act", outcome="held_back")
    _ok(at)
    assert list(at.dataframe[2].value["job"]) == ["act-3"]
    at.selectbox(key="actions_outcome").set_value("any").run()
    at.text_input(key="actions_user").set_value("bob").run()
    _ok(at)
    assert at.query_params == {"user": "bob", "step": "act"}
    by_user, _, listed = (frame.value for frame in at.dataframe)
    assert list(by_user["user"]) == ["bob"]
    assert list(listed["job"]) == ["act-5", "act-1"] and list(listed["what"]) == [f"failed: {FAILED}", "cancelled"]
    at.text_input(key="actions_user").set_value("").run()
    at.selectbox(key="actions_step").set_value("any").run()
    at.selectbox(key="actions_range").set_value("all time").run()
    _ok(at)
    assert {m.label: m.value for m in at.metric}["Jobs"] == "8"
    assert "chem" in set(at.dataframe[1].value["account"])
    at.text_input(key="actions_account").set_value("nobody").run()
    _ok(at)
    assert "No steps match these filters." in [i.value for i in at.info] and len(at.dataframe) == 0


def test_the_actions_page_is_not_offered_to_users(app_as: Callable[..., AppTest], acted: str) -> None:
    at = app_as("alice")
    with pytest.raises(ValueError):
        at.switch_page("views/actions.py")  # not registered for a non-admin at all
    # Run as a script of its own (no navigation), the page still refuses.
    page = AppTest.from_file(str(REPO / "dashboard" / "views" / "actions.py"), default_timeout=60)
    page.user = {"is_logged_in": True, "preferred_username": "alice"}
    page.run()
    _ok(page)
    assert [e.value for e in page.error] == ["The actions across jobs are for admins only."]
    assert not page.dataframe and not page.metric
    with pytest.raises(PermissionError):
        data.actions(Viewer("alice", is_admin=False), cluster=acted)
    with pytest.raises(PermissionError):
        data.action_counts(Viewer("alice", is_admin=False), "user_name", cluster=acted)


# -- the query and the words -------------------------------------------------------------------------


def test_the_counts_query_over_all_time_and_its_filters(database_url: str, acted_seed: str) -> None:
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        everyone = action_counts(conn, "user_name", cluster=acted_seed)
        # Tied on actions and warnings, by name, a job without a row after the named ones.
        assert [r["name"] for r in everyone] == ["alice", "bob", "dave", None, "carol"]
        assert sum(r["jobs"] for r in everyone) == 8
        week = dt.datetime.now(UTC) - dt.timedelta(days=7)
        chem = action_counts(conn, "account", cluster=acted_seed, account="chem", since=week)
        assert chem == []
        rows, total = list_actions(conn, cluster=acted_seed, outcome="done", since=week)
        assert total == 2 and {r["job_id"] for r in rows} == {"act-1", "act-7"}
        with pytest.raises(ValueError, match="cannot count actions by 'name'"):
            action_counts(conn, "name")


@pytest.mark.parametrize(("row", "words", "note"), [
    ({"step": "warn", "outcome": "recorded", "detail": REASON}, "first warning", REASON),
    ({"step": "warn_again", "dry_run": True, "detail": REASON}, "second warning (dry run)", REASON),
    ({"step": "act", "outcome": "done", "evidence": {"action": "requeue"}, "detail": REASON}, "requeued", REASON),
    ({"step": "act", "outcome": "pending", "evidence": {"action": "cancel"}}, "cancelling", None),
    ({"step": "act", "outcome": "recorded", "dry_run": True, "evidence": {"action": "requeue"}},
     "would have requeued (dry run)", None),
    ({"step": "act", "outcome": "recorded", "evidence": {"action": "notify-only"}, "detail": REASON},
     "final notice (the policy only notifies)", REASON),
    ({"step": "act", "outcome": "failed", "evidence": {}, "detail": ""}, "failed: no reason given", None),
    ({"step": "exempt", "outcome": "recorded", "detail": ""}, "exempt", None),
    ({"step": "pause", "outcome": "recorded"}, "pause", None),
])
def test_a_step_in_words(row: dict[str, Any], words: str, note: str | None) -> None:
    assert (action_steps.words(row), action_steps.note(row)) == (words, note)


# -- hostile strings -----------------------------------------------------------------------------------

END_REASON = "jobsight: **[click](https://evil)** <img src=x> :red[idle] $x$"
POLICY = "_p_ [p](https://evil)"
EXEMPT_WHY = "interactive partition <!channel> www.evil.example"
SLURM_SAID = "scancel: [x](https://evil) <b>no</b> @everyone"


@pytest.fixture(scope="module")
def hostile_acts_seed(database_url: str) -> str:
    cluster = f"hostile-acts-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as conn, conn.transaction():
        _insert_job(conn, cluster, "evil-act", "alice", "ml", "cancelled", END_REASON,
                    name="**[click](https://evil)** <img src=x>")
        _insert_step(conn, cluster, Step("evil-act", "exempt", 30, detail=EXEMPT_WHY, policy=POLICY), 1)
        _insert_step(conn, cluster, Step("evil-act", "act", 20, outcome="failed", detail=SLURM_SAID), 2)
    return cluster


@pytest.fixture
def hostile_acts(dashboard_env: Seed, hostile_acts_seed: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_CLUSTER", hostile_acts_seed)
    yield hostile_acts_seed


def test_the_job_page_shows_a_hostile_end_reason_and_details_as_text(app_as: Callable[..., AppTest],
                                                                     hostile_acts: str) -> None:
    at = app_as("alice", "views/job.py", cluster=hostile_acts, job="evil-act")
    _ok(at)
    [ended] = [i.value for i in at.info if "— jobsight" in i.value]
    assert ended == r"CANCELLED — jobsight\: \*\*\[click\]\(https\://evil\)\*\* \<img src=x\> \:red\[idle\] \$x\$"
    assert reading(ended) == (f"CANCELLED — {END_REASON}", [])
    lines = _timeline(at)
    assert [line.split(" · ", 1)[1] for line in lines] == [f"policy {POLICY} · exempt: {EXEMPT_WHY}",
                                                          f"policy gpu-idle · failed: {SLURM_SAID}"]
    # Every element that renders Markdown, ours included: no link, image or HTML anywhere.
    for source in markdown_sources(at):
        assert reading(source)[1] == [], source


def test_the_actions_page_keeps_hostile_text_as_it_is(app_as: Callable[..., AppTest], hostile_acts: str) -> None:
    at = app_as("root", "views/actions.py")
    _ok(at)
    listed = at.dataframe[2].value
    assert list(listed["what"]) == [f"failed: {SLURM_SAID}", f"exempt: {EXEMPT_WHY}"]
    assert list(listed["policy"]) == ["gpu-idle", POLICY]
    for source in markdown_sources(at):
        assert reading(source)[1] == [], source


def test_the_timeline_escapes_what_it_is_given() -> None:
    row = {"at": dt.datetime(2024, 3, 4, 10, 0, tzinfo=UTC), "policy": POLICY, "step": "exempt",
           "outcome": "recorded", "detail": EXEMPT_WHY}
    source = timeline([row])
    assert source == r"- **2024-03-04 10:00 UTC** · policy \_p\_ \[p\]\(https\://evil\) · exempt\: interactive " \
                     r"partition \<\!channel\> www\.evil.example"
    assert reading(source) == (f"2024-03-04 10:00 UTC · policy {POLICY} · exempt: {EXEMPT_WHY}", [])
