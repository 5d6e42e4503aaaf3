"""Each dashboard page on seeded data through Streamlit's AppTest."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable

from streamlit.testing.v1 import AppTest

from jobsight.rules import display_text
from tests.dashboard.conftest import chart_titles, job_sections, sections_texts, texts
from tests.dashboard.header_facts import header_facts
from tests.dashboard.seed import PERIOD, TOTAL_GPU_HOURS, TOTAL_KWH, Seed


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def test_jobs_page_shows_only_the_users_own_jobs_running_first(app_as: Callable[..., AppTest],
                                                                dashboard_env: Seed) -> None:
    at = app_as("alice")
    _ok(at)
    at.selectbox(key="jobs_range").set_value("all time").run()
    _ok(at)
    table = at.dataframe[0].value
    assert list(table["job"]) == [dashboard_env.running, dashboard_env.alice_done]
    assert set(table["user"]) == {"alice"}
    assert table["open"][0] == f"job?cluster={dashboard_env.cluster}&job={dashboard_env.running}"
    # The id is the link: the grid shows what the link's display pattern takes from it (JavaScript's
    # regular expressions read this pattern as Python's do), under "job", and no second id column.
    link = json.loads(at.dataframe[0].proto.columns)["open"]
    assert link["label"] == "job" and "job" not in at.dataframe[0].proto.column_order
    shown = [re.search(link["type_config"]["display_text"], url) for url in table["open"]]
    assert [m.group(1) if m else None for m in shown] == list(table["job"])
    # No job of an array listed: the empty column is left out of the view (the table fits at 1600 px).
    assert "array" in table and "array" not in at.dataframe[0].proto.column_order
    assert "b1-idle" not in texts(at)
    assert all(w.key != "jobs_user" for w in at.text_input)  # no user filter for non-admins


def test_jobs_page_filters_for_an_admin(app_as: Callable[..., AppTest], dashboard_env: Seed) -> None:
    at = app_as("root")
    at.selectbox(key="jobs_range").set_value("all time").run()
    assert len(at.dataframe[0].value) == 4
    at.text_input(key="jobs_user").set_value("bob").run()
    assert set(at.dataframe[0].value["job"]) == {dashboard_env.bob_idle, dashboard_env.bob_debug}
    at.number_input(key="jobs_below").set_value(10.0).run()
    _ok(at)
    assert list(at.dataframe[0].value["job"]) == [dashboard_env.bob_idle]
    at.text_input(key="jobs_user").set_value("").run()
    at.number_input(key="jobs_below").set_value(None).run()
    at.selectbox(key="jobs_state").set_value("running").run()
    assert list(at.dataframe[0].value["job"]) == [dashboard_env.running]


def test_owner_sees_the_live_job_page(app_as: Callable[..., AppTest], dashboard_env: Seed) -> None:
    sections = job_sections(app_as, "alice", cluster=dashboard_env.cluster, job=dashboard_env.running)
    for at in sections.values():
        _ok(at)
    said = sections_texts(sections)
    assert f"Job {dashboard_env.running}" in said and "llm-pretrain" in said
    for at in sections.values():  # the header, above whichever section is open
        facts = header_facts(at)
        assert (facts["User"], facts["State"], facts["GPUs"]) == ("alice", "RUNNING", "2")
    assert "Straggler rank(s): 1" in said
    assert "Rank 1 waits on the data loader" in said  # diagnosis hint
    # Heatmap, a node's GPU lines, steps, throughput; loss and lr; energy per epoch; the profile's breakdown.
    titles = {title for at in sections.values() for title in chart_titles(at)}
    assert len(titles) >= 6 and {'"loss"', '"lr"', '"Energy per epoch"', '"Per-rank breakdown"'} <= titles, titles
    top_ops = next(d.value for d in sections["profiles"].dataframe if "self_device_us" in d.value.columns)
    assert list(top_ops["name"]) == ["aten::mm", "aten::copy_"]
    at = sections["logs"]
    logs = next(d.value for d in at.dataframe if "message" in d.value.columns)
    assert len(logs) == 4
    at.selectbox(key="log_level").set_value("WARNING").run()
    logs = next(d.value for d in at.dataframe if "message" in d.value.columns)
    assert set(logs["message"]) == {"slow data loader on rank 1", "loss spike detected"}
    at.text_input(key="log_rank").set_value("0").run()
    logs = next(d.value for d in at.dataframe if "message" in d.value.columns)
    assert list(logs["message"]) == ["loss spike detected"]


def test_user_cannot_open_another_users_job(app_as: Callable[..., AppTest], dashboard_env: Seed) -> None:
    at = app_as("bob", "views/job.py", cluster=dashboard_env.cluster, job=dashboard_env.running)
    _ok(at)
    said = texts(at)
    assert "not your job" in said
    for leak in ("alice", "llm-pretrain", "loss spike", "n1", "prof-1", "Straggler"):
        assert leak not in said, leak
    assert not at.get("vega_lite_chart") and not at.dataframe and not at.metric


def test_admin_can_open_any_job(app_as: Callable[..., AppTest], dashboard_env: Seed) -> None:
    at = app_as("root", "views/job.py", cluster=dashboard_env.cluster, job=dashboard_env.running)
    _ok(at)
    assert header_facts(at)["User"] == "alice" and at.get("vega_lite_chart")


def test_finished_job_without_series_shows_empty_states(app_as: Callable[..., AppTest], dashboard_env: Seed) -> None:
    sections = job_sections(app_as, "alice", cluster=dashboard_env.cluster, job=dashboard_env.alice_done)
    for at in sections.values():
        _ok(at)
    said = sections_texts(sections)
    assert "No GPU samples" in said and "No step timings" in said and "No profiles" in said
    assert all(header_facts(at)["State"] == "COMPLETED" for at in sections.values())


def test_profile_request_is_stored(app_as: Callable[..., AppTest], dashboard_env: Seed, db: object) -> None:
    at = app_as("alice", "views/job.py", cluster=dashboard_env.cluster, job=dashboard_env.running, details="profiles")
    at.number_input[0].set_value(25)
    next(t for t in at.text_input if t.label.startswith("Ranks")).set_value("0, 1")
    next(b for b in at.button if b.label == "Request profile").click().run()
    _ok(at)
    assert any("Profile request" in s.value for s in at.success)
    row = db.execute(  # type: ignore[attr-defined]
        "SELECT steps, ranks, state, requested_by FROM profile_requests WHERE cluster = %s AND job_id = %s",
        (dashboard_env.cluster, dashboard_env.running)).fetchone()
    assert row == (25, [0, 1], "pending", "alice")


def test_audit_totals_match_the_hand_computed_figures(app_as: Callable[..., AppTest], dashboard_env: Seed) -> None:
    at = app_as("root", "views/audit.py")
    _ok(at)
    at.date_input(key="audit_from").set_value(PERIOD[0])
    at.date_input(key="audit_to").set_value(PERIOD[1]).run()
    _ok(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Jobs"] == "3"
    assert metrics["GPU-hours"] == display_text.gpu_hours(TOTAL_GPU_HOURS) == "52.00"
    assert metrics["Energy (kWh)"] == display_text.energy(TOTAL_KWH, unit=False) == "6.5000"
    assert metrics["Mean GPU utilisation"] == "28 %"
    by_user = at.dataframe[0].value.set_index("user")
    assert by_user.loc["alice", "gpu_hours"] == 16.0 and by_user.loc["bob", "gpu_hours"] == 36.0
    assert round(by_user.loc["bob", "energy_share"], 4) == round(2.5 / 6.5, 4)
    idle = next(d.value for d in at.dataframe if "open" in d.value.columns)
    assert list(idle["job_id"]) == [dashboard_env.bob_idle]
    trend = at.dataframe[-1].value
    assert [round(h, 6) for h in trend["gpu_hours"]] == [36.0, 16.0]
    assert [d.date() for d in trend["day"]] == [dt.date(2024, 3, 4), dt.date(2024, 3, 5)]
    assert len(at.get("download_button")) == 6


def test_audit_is_not_offered_to_users(app_as: Callable[..., AppTest], dashboard_env: Seed) -> None:
    at = app_as("alice")
    try:
        at.switch_page("views/audit.py")
    except ValueError:
        return  # not registered for a non-admin at all
    at.run()
    assert "GPU-hours" not in texts(at)


def test_logged_out_visitor_sees_a_login_and_no_data(app_as: Callable[..., AppTest], dashboard_env: Seed) -> None:
    at = app_as(None)
    _ok(at)
    assert "Please log in" in texts(at) and at.button[0].label == "Log in"
    assert not at.dataframe
