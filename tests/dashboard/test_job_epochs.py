"""The job page's energy per epoch and the audit's running-job energy, through Streamlit's AppTest on
the seeded cluster (tests/dashboard/seed.py: the running job ``a1`` has two GPUs whose counters
rise 300 J a second for 30 minutes, and two ranks stepping once a second, epoch ``t // 600``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest
from streamlit.testing.v1 import AppTest

from jobsight.rules import display_text
from tests.dashboard.conftest import texts
from tests.dashboard.seed import Seed

J_PER_KWH = 3.6e6


def _figure(cell: str) -> float:
    """A table's figure as display_text wrote it ("≥ 0.099833") back as a number."""
    return float(cell.removeprefix(display_text.GROWING))


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def test_running_job_page_shows_its_epochs_and_energy_so_far(app_as: Callable[..., AppTest],
                                                               dashboard_env: Seed) -> None:
    at = app_as("alice", "views/job.py", cluster=dashboard_env.cluster, job=dashboard_env.running, details="energy")
    _ok(at)
    said = texts(at)
    assert "Energy per epoch" in said
    metrics = {m.label: m.value for m in at.metric}
    so_far = 2 * 1799 * 300 / J_PER_KWH  # two GPUs, 300 J/s from the first sample to the last
    # The GPUs' energy so far is said once, by the formatter the report uses, and not again per epoch.
    assert metrics["GPUs (kWh)"] == display_text.energy(so_far, growing=True, unit=False) == "≥ 0.29983"
    assert not any(label.startswith("Energy so far") for label in metrics)
    assert metrics["Method"] == "counter" and metrics["Epochs"] == "3"
    table = next(d.value for d in at.dataframe if "J/sample" in d.value.columns)
    assert list(table["epoch"]) == [0, 1, 2]
    assert list(table["steps"]) == [600, 600, 600]
    assert list(table["samples"]) == [600 * 2 * 32] * 3
    # Epochs 0 and 1 are 600 s of both GPUs; the last runs to the last step, 599 s after its first.
    assert list(table["J"]) == pytest.approx([360_000.0, 360_000.0, 359_400.0])
    assert list(table["J/sample"]) == pytest.approx([360_000 / 38_400, 360_000 / 38_400, 359_400 / 38_400])
    # Each epoch's energy as the metric above prints the job's, the running epoch's marked as growing.
    assert list(table["GPU kWh"]) == [display_text.energy(360_000 / J_PER_KWH, unit=False)] * 2 + [
        display_text.energy(359_400 / J_PER_KWH, growing=True, unit=False)] == ["0.10000", "0.10000", "≥ 0.099833"]
    assert list(table["method"]) == ["counter"] * 3
    assert "Energy per epoch" in str([c.proto.spec for c in at.get("vega_lite_chart")])


def test_job_without_gpu_samples_says_it_has_no_energy(app_as: Callable[..., AppTest], dashboard_env: Seed) -> None:
    at = app_as("alice", "views/job.py", cluster=dashboard_env.cluster, job=dashboard_env.alice_done, details="energy")
    _ok(at)
    assert "No GPU energy for this job yet" in texts(at)
    assert not any("J/sample" in d.value.columns for d in at.dataframe)


def test_audit_counts_the_running_job_and_marks_it_growing(app_as: Callable[..., AppTest],
                                                             dashboard_env: Seed) -> None:
    at = app_as("root", "views/audit.py")
    today = dt.datetime.now(dt.UTC).date()
    at.date_input(key="audit_from").set_value(today - dt.timedelta(days=1))
    at.date_input(key="audit_to").set_value(today).run()
    _ok(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Jobs"] == "1"
    assert metrics["Energy (kWh)"] == display_text.energy(2 * 1799 * 300 / J_PER_KWH, growing=True, unit=False)
    by_user = at.dataframe[0].value.set_index("user")
    assert by_user.loc["alice", "running_jobs"] == 1
    assert by_user.loc["alice", "energy note"] == "≥ still growing"
    assert by_user.loc["alice", "energy_kwh"] == pytest.approx(2 * 1799 * 300 / J_PER_KWH)


def test_job_page_and_audit_show_the_same_emissions(app_as: Callable[..., AppTest], dashboard_env: Seed,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """With a site intensity and PUE, the running job's page shows its whole energy (its GPUs here: the
    seeded nodes have no node power source, and the page says so) and kg CO2e so far, and the audit
    counts the same."""
    monkeypatch.setenv("JOBSIGHT_CARBON_INTENSITY_G_PER_KWH", "250")
    monkeypatch.setenv("JOBSIGHT_CARBON_PUE", "1.5")
    kwh = 2 * 1799 * 300 / J_PER_KWH
    kg = kwh * 1.5 * 250 / 1000
    at = app_as("alice", "views/job.py", cluster=dashboard_env.cluster, job=dashboard_env.running, details="energy")
    _ok(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Energy, whole job (kWh)"] == display_text.energy(kwh, growing=True, unit=False)
    assert metrics["GPUs (kWh)"] == display_text.energy(kwh, growing=True, unit=False)
    assert metrics["Rest of the nodes (kWh)"] == "-"
    assert metrics["Emissions (kg CO2e)"] == display_text.co2e(kg, growing=True, unit=False)
    said = texts(at)
    assert "GPUs only: no node power source on its nodes" in said and "PUE 1.50 x 250.0 g CO2e/kWh (site value)" in said
    table = next(d.value for d in at.dataframe if "J/sample" in d.value.columns)
    assert sum(map(_figure, table["kg CO2e"])) == pytest.approx(kg * sum(map(_figure, table["GPU kWh"])) / kwh,
                                                               rel=1e-4)

    audit = app_as("root", "views/audit.py")
    today = dt.datetime.now(dt.UTC).date()
    audit.date_input(key="audit_from").set_value(today - dt.timedelta(days=1))
    audit.date_input(key="audit_to").set_value(today).run()
    _ok(audit)
    # The audit prints the same figure as the job's page.
    assert {m.label: m.value for m in audit.metric}["Emissions (kg CO2e)"] == metrics["Emissions (kg CO2e)"]
