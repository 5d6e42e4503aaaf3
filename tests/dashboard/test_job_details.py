"""The job page's details, one section at a time (:mod:`jobsight.dashboard.job_details`): none until
chosen, the section chosen kept in the address as ``details=<token>``.

Through Streamlit's AppTest on the seeded running job (tests/dashboard/seed.py), which has training
metrics, epochs with energy, log lines and a profile, so every section has something to draw. AppTest's
element tree holds whatever the script built, a collapsed expander's or a closed tab's content
included: an element missing from it was never built, not merely hidden.
"""

from __future__ import annotations

from collections.abc import Callable

from streamlit.testing.v1 import AppTest

from jobsight.dashboard import job_details
from tests.dashboard.conftest import chart_titles, texts
from tests.dashboard.seed import Seed


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def _open(app_as: Callable[..., AppTest], seed: Seed, **query: str) -> AppTest:
    at = app_as("alice", "views/job.py", cluster=seed.cluster, job=seed.running, **query)
    _ok(at)
    return at


def _tables(at: AppTest) -> set[str]:
    """Which of the details' tables the page built: the log lines, the energy per epoch, the profile listing."""
    built = set()
    for frame in at.dataframe:
        columns = set(frame.value.columns)
        if "message" in columns:
            built.add("logs")
        if "J/sample" in columns:
            built.add("epochs")
        if "trace KiB" in columns:
            built.add("profiles")
    return built


def _profile_form(at: AppTest) -> bool:
    return any(b.label == "Request profile" for b in at.button) or "Profile the next N steps" in texts(at)


def _node_lines(at: AppTest) -> bool:
    return any(w.key == "job_nodes" for w in at.multiselect) or any(": GPU utilisation" in t for t in chart_titles(at))


def _on_nothing(at: AppTest) -> None:
    """No section chosen: none of the five built, the parts above them drawn."""
    assert at.radio(key=job_details.KEY).value is None
    assert not {'"loss"', '"lr"'} & set(chart_titles(at)) and not _node_lines(at)
    assert not any(e.label.startswith("Timeline markers") for e in at.expander)
    assert _tables(at) == set() and not _profile_form(at)
    assert not [w for w in at.selectbox if w.key == "log_level"]
    assert '"Energy per epoch"' not in chart_titles(at) and '"Per-rank breakdown"' not in chart_titles(at)
    assert "Straggler rank(s): 1" in texts(at) and '"Step time per rank"' in chart_titles(at)
    assert any('"GPU utilisation, every GPU"' == t for t in chart_titles(at))
    assert job_details.PARAM not in at.query_params  # the default is left out of the address


def _on_metrics(at: AppTest) -> None:
    """The training metrics' section open, and nothing of the other four built."""
    assert at.radio(key=job_details.KEY).value == job_details.METRICS
    assert {'"loss"', '"lr"'} <= set(chart_titles(at))
    assert any(e.label.startswith("Timeline markers") for e in at.expander)
    assert _tables(at) == set() and not _profile_form(at) and not _node_lines(at)
    assert not [w for w in at.selectbox if w.key == "log_level"]
    assert '"Energy per epoch"' not in chart_titles(at) and '"Per-rank breakdown"' not in chart_titles(at)
    said = texts(at)
    assert "Energy per epoch" not in said and "Profiles" not in said and "No log lines" not in said


def test_the_job_page_opens_on_no_section_and_builds_none(app_as: Callable[..., AppTest], dashboard_env: Seed) -> None:
    _on_nothing(_open(app_as, dashboard_env))


def test_details_metrics_and_nodes_open_their_sections(app_as: Callable[..., AppTest], dashboard_env: Seed) -> None:
    at = _open(app_as, dashboard_env, details="metrics")
    _on_metrics(at)
    assert at.query_params[job_details.PARAM] == "metrics"
    # The parts above the details are drawn whichever section is open.
    assert "Straggler rank(s): 1" in texts(at) and '"Step time per rank"' in chart_titles(at)
    at = _open(app_as, dashboard_env, details="nodes")
    assert at.radio(key=job_details.KEY).value == job_details.NODES and _node_lines(at)
    assert not {'"loss"', '"lr"'} & set(chart_titles(at)) and _tables(at) == set()


def test_details_logs_opens_the_job_on_its_logs(app_as: Callable[..., AppTest], dashboard_env: Seed) -> None:
    at = _open(app_as, dashboard_env, details="logs")
    assert at.radio(key=job_details.KEY).value == job_details.LOGS
    assert _tables(at) == {"logs"} and not _profile_form(at)
    assert at.selectbox(key="log_level").value == "DEBUG"
    assert '"loss"' not in chart_titles(at)  # the training metrics are not built either
    assert at.query_params[job_details.PARAM] == "logs"


def test_choosing_a_section_shows_it_and_writes_it_in_the_address(app_as: Callable[..., AppTest],
                                                                   dashboard_env: Seed) -> None:
    at = _open(app_as, dashboard_env)
    at.radio(key=job_details.KEY).set_value(job_details.ENERGY).run()
    _ok(at)
    assert at.query_params[job_details.PARAM] == "energy"
    assert _tables(at) == {"epochs"} and '"Energy per epoch"' in chart_titles(at) and not _profile_form(at)
    at.radio(key=job_details.KEY).set_value(job_details.PROFILES).run()
    _ok(at)
    assert at.query_params[job_details.PARAM] == "profiles"
    assert _tables(at) == {"profiles"} and _profile_form(at)
    assert '"Per-rank breakdown"' in chart_titles(at) and '"loss"' not in chart_titles(at)
    at.radio(key=job_details.KEY).set_value(job_details.METRICS).run()
    _ok(at)
    _on_metrics(at)
    assert at.query_params[job_details.PARAM] == "metrics"


def test_an_unknown_details_token_opens_no_section(app_as: Callable[..., AppTest], dashboard_env: Seed) -> None:
    _on_nothing(_open(app_as, dashboard_env, details="everything"))  # and the address says what the page shows
