"""A job's whole energy and emissions agree wherever they are shown: the API, ``jobsight report``'s
text, the audit's totals and groups, and the monthly report's totals, and the GPU part is the figure
the job had before node power existed.

The job is the energy scenario's (tests/collector/energy_scenario.py: two GPUs with counters, real
sampler over the fake library), placed so that its 150 s cross a UTC hour; its node daemon sent 40 J
of node energy with each host sample. The carbon intensity is a time series file the site provides:
100 g/kWh the first hour, 500 the next, so the hours' weights matter; PUE 1.2.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from jobsight.agent.node.gpu.reading import GpuReading
from jobsight.collector.config.alerts import AlertSettings
from jobsight.collector.config.carbon import CarbonSettings
from jobsight.collector.config.notices import NoticeSettings
from jobsight.collector.passes import notice_messages
from jobsight.collector.passes.emissions import fill_emissions
from jobsight.collector.passes.reports import _ENDED_IN, Reports, _totals
from jobsight.collector.query import audit
from jobsight.collector.query.job_energy import carbon_of, co2e_per_kwh
from jobsight.rules.report_text import format_report
from tests.collector import energy_scenario as sc

J_PER_KWH = 3.6e6
HOUR_S = 3600
NODE_J = 40.0
PUE = 1.2
FIRST, SECOND = 100.0, 500.0
BOUNDARY_TICK = 12
"""The scenario's tick that falls on the hour: ticks 0–11 are in the first hour."""


@pytest.fixture
def ticks(fake_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[GpuReading]]:
    return sc.sample_scenario(fake_library, tmp_path, monkeypatch)


@pytest.fixture
def hour() -> dt.datetime:
    """The hour the job crosses: two hours ago, so that the job has ended well before now."""
    return dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=2)


@pytest.fixture
def carbon(tmp_path: Path, hour: dt.datetime) -> CarbonSettings:
    series = tmp_path / "intensity.csv"
    series.write_text("datetime,carbonIntensity\n"
                      f"{(hour - dt.timedelta(hours=1)).isoformat()},{FIRST}\n{hour.isoformat()},{SECOND}\n")
    return CarbonSettings(pue=PUE, series_csv=str(series), intensity_g_per_kwh=300.0)


@pytest.fixture
def carbon_client(database_url: str, data_dir: Path, admin_token: str, carbon: CarbonSettings) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from jobsight.collector.app import create_app
    from jobsight.collector.config.settings import load_collector_settings

    settings = load_collector_settings(database_url=database_url, data_dir=data_dir, carbon=carbon)
    with TestClient(create_app(settings)) as test_client:
        test_client.headers["Authorization"] = f"Bearer {admin_token}"
        yield test_client


def host_records(job: str, t0: int) -> list[dict[str, Any]]:
    """What the node daemon sends: a host sample a tick, each but the first with 40 J of node energy."""
    return [{"kind": "host_sample", "job": job, "ts": t0 + i * sc.INTERVAL_S * sc.S, "node": "n1",
             "cpu_time_s": float(i), "mem_used": 1 << 30,
             **({"energy_j": NODE_J, "power_source": "rapl", "energy_split": "cpu_time+idle_cores"} if i else {})}
            for i in range(sc.TICKS)]


def _number(text: str, label: str) -> float:
    found = re.search(rf"{label}: ([0-9.]+) ", text)
    assert found is not None, f"{label!r} not in the report:\n{text}"
    return float(found.group(1))


def test_page_report_and_audit_agree(carbon_client: Any, database_url: str, job_id: str, hour: dt.datetime,
                                     ticks: list[list[GpuReading]], carbon: CarbonSettings) -> None:
    t0 = int((hour.timestamp() - BOUNDARY_TICK * sc.INTERVAL_S) * sc.S)
    cluster = f"energy-{job_id}"  # the audit's totals are this job's alone
    sc.send(carbon_client, [sc.started(job_id, t0, "erin", ["n1:0", "n1:1"]),
                            *sc.gpu_records(job_id, ticks, {0, 1}, t0), *host_records(job_id, t0),
                            *sc.step_records(job_id, t0), sc.ended(job_id, t0)], cluster)
    carbon_client.params = {"cluster": cluster}
    # Before the pass: the job's figures are computed on the fly; the pass then keeps them.
    live = carbon_client.get(f"/v1/jobs/{job_id}/energy").json()
    with psycopg.connect(database_url, row_factory=dict_row, autocommit=True) as conn:
        assert fill_emissions(conn, carbon_of(carbon)) >= 1
        stored_co2e = conn.execute("SELECT co2e_kg FROM job_summaries WHERE job_id = %s", (job_id,)).fetchone()
    energy = carbon_client.get(f"/v1/jobs/{job_id}/energy").json()
    assert energy["final"] is True
    assert energy["emissions"]["co2e_kg"] == pytest.approx(live["emissions"]["co2e_kg"], rel=1e-9)

    # The GPU part is the counters' rise, as the summary and the epochs always said.
    gpu_j = sum(sc.counter_j(g, 0, (sc.TICKS - 1) * sc.INTERVAL_S) for g in (0, 1))
    assert energy["gpu_kwh"] * J_PER_KWH == pytest.approx(gpu_j, rel=1e-6)
    summary = carbon_client.get(f"/v1/jobs/{job_id}/summary").json()
    assert energy["gpu_kwh"] == summary["summary"]["energy_kwh"]
    assert carbon_client.get(f"/v1/jobs/{job_id}/epochs").json()["energy_kwh"] == pytest.approx(energy["gpu_kwh"])
    node_j = NODE_J * (sc.TICKS - 1)
    assert energy["node_kwh"] * J_PER_KWH == pytest.approx(node_j)
    assert energy["node"]["sources"] == ["rapl"] and energy["node"]["measured"] == sc.TICKS - 1

    # Emissions, hour by hour: ticks 0-11 in the first hour (the counters' rise to tick 11, 11 host
    # samples), the rest in the second.
    first_gpu = sum(sc.counter_j(g, 0, (BOUNDARY_TICK - 1) * sc.INTERVAL_S) for g in (0, 1))
    first = (first_gpu + NODE_J * (BOUNDARY_TICK - 1)) / J_PER_KWH
    second = (gpu_j + node_j) / J_PER_KWH - first
    expected = PUE * (first * FIRST + second * SECOND) / 1000
    assert energy["emissions"]["co2e_kg"] == pytest.approx(expected, rel=1e-6)
    assert stored_co2e is not None and stored_co2e["co2e_kg"] == pytest.approx(expected, rel=1e-6)
    assert energy["emissions"]["pue"] == PUE
    assert any("time series file" in s for s in energy["emissions"]["intensity_sources"])
    total = energy["total_kwh"]
    assert total == pytest.approx((gpu_j + node_j) / J_PER_KWH)

    # jobsight report's text.
    job = carbon_client.get(f"/v1/jobs/{job_id}").json()
    text = format_report(job, summary)
    assert _number(text, "Energy") == pytest.approx(total, rel=1e-3)
    assert _number(text, "GPU energy") == pytest.approx(energy["gpu_kwh"], rel=1e-3)
    assert _number(text, "Emissions") == pytest.approx(expected, rel=1e-3)
    assert "RAPL (CPU packages and DRAM)" in text and "by CPU time, idle power by allocated cores" in text

    # The audit, over a period holding the whole job: totals and the user's row.
    start, end = hour - dt.timedelta(days=1), hour + dt.timedelta(days=1)
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        factor = co2e_per_kwh(carbon_of(carbon))
        totals = audit.audit_totals(conn, start, end, cluster=cluster, co2e_per_kwh=factor)
        (erin,) = audit.gpu_hours_by(conn, "user_name", start, end, cluster=cluster, co2e_per_kwh=factor)
    for figures in (totals, erin):
        assert figures["energy_kwh"] == pytest.approx(energy["gpu_kwh"], rel=1e-9)
        assert figures["node_energy_kwh"] == pytest.approx(energy["node_kwh"], rel=1e-9)
        assert figures["total_energy_kwh"] == pytest.approx(total, rel=1e-3)
        assert figures["co2e_kg"] == pytest.approx(expected, rel=1e-3)
    assert erin["name"] == "erin" and erin["jobs"] == 1

    # The periodic (monthly) report's totals add up what the summaries keep.
    reports = Reports(NoticeSettings(), AlertSettings(), None, carbon_of(carbon))
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        jobs = [{**r, "idle_gpu_hours": 0.0} for r in conn.execute(
            _ENDED_IN + " AND j.cluster = %(cluster)s", {"start": start, "end": end, "cluster": cluster}).fetchall()]
        message = notice_messages.period_report(whom="erin", label="the month", totals=_totals(jobs), worst=[],
                                                dashboard_url=None)
    said = "\n".join("".join(str(part) for part in line) for line in message.lines)
    assert f"Energy of the rest of the nodes: {energy['node_kwh']:.2f} kWh" in said
    assert f"Emissions: {expected:.2f} kg CO2e" in said
    assert reports.carbon is not None
