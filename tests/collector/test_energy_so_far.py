"""A running job's energy so far: on its epochs, in its live summary and in the audit, where the
figures that count running jobs say so. GPUs are read by the real node sampler over the fake
libnvidia-ml.so.1 (tests/collector/energy_scenario.py)."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from jobsight.agent.node.gpu.reading import GpuReading
from jobsight.collector.query import audit as audit_queries
from jobsight.collector.query.energy_so_far import energy_so_far_kwh
from jobsight.protocol.wire import now_us
from tests.collector import energy_scenario as sc

J_PER_KWH = 3.6e6
MINUTE = 60 * sc.S
HALF = 20
"""Ticks sent while the job runs: samples 0–19, up to 95 s, in epoch 1."""
HALF_S = (HALF - 1) * sc.INTERVAL_S


@pytest.fixture
def ticks(fake_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[GpuReading]]:
    return sc.sample_scenario(fake_library, tmp_path, monkeypatch)


def _t0() -> int:
    return (now_us() // MINUTE - 30) * MINUTE + 40 * sc.S


def test_running_job_shows_its_energy_so_far_and_it_grows(
    client: Any, database_url: str, job_id: str, ticks: list[list[GpuReading]]
) -> None:
    t0 = _t0()
    sc.send(client, [sc.started(job_id, t0, "erin", ["n1:0", "n1:1"]),
                     *sc.gpu_records(job_id, ticks, {0, 1}, t0, ticks_to=HALF),
                     *sc.step_records(job_id, t0, to_s=HALF_S)])
    so_far = sum(sc.counter_j(g, 0, HALF_S) for g in sc.COUNTER_GPUS)

    epochs = client.get(f"/v1/jobs/{job_id}/epochs").json()
    assert epochs["running"] is True and [e["epoch"] for e in epochs["epochs"]] == [0, 1]
    assert [e["growing"] for e in epochs["epochs"]] == [False, True]
    assert epochs["epochs"][1]["energy_j"] == pytest.approx(sum(sc.counter_j(g, 60, HALF_S) for g in sc.COUNTER_GPUS))
    assert epochs["energy_j"] == pytest.approx(so_far, rel=1e-9)
    live = client.get(f"/v1/jobs/{job_id}/summary").json()
    assert live["final"] is False and live["summary"]["energy_kwh"] * J_PER_KWH == pytest.approx(so_far, rel=1e-9)
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        assert energy_so_far_kwh(conn, "default", job_id) == pytest.approx(so_far / J_PER_KWH, rel=1e-9)

    sc.send(client, [*sc.gpu_records(job_id, ticks, {0, 1}, t0, ticks_from=HALF),
                     *sc.step_records(job_id, t0, from_s=HALF_S + 1)])
    grown = client.get(f"/v1/jobs/{job_id}/epochs").json()
    whole = sum(sc.counter_j(g, 0, (sc.TICKS - 1) * sc.INTERVAL_S) for g in sc.COUNTER_GPUS)
    assert [e["epoch"] for e in grown["epochs"]] == [0, 1, 2] and grown["energy_j"] == pytest.approx(whole, rel=1e-9)
    assert grown["epochs"][0]["energy_j"] == pytest.approx(epochs["epochs"][0]["energy_j"], rel=1e-12)


def test_audit_counts_running_jobs_energy_and_marks_it(client: Any, database_url: str,
                                                       ticks: list[list[GpuReading]]) -> None:
    cluster = f"audit-{uuid.uuid4().hex[:8]}"
    t0 = _t0()
    done, running, power_only = "e-done", "e-running", "f-running"
    sc.send(client, [
        sc.started(done, t0, "erin", ["n1:0", "n1:1"]), *sc.gpu_records(done, ticks, {0, 1}, t0),
        *sc.step_records(done, t0), sc.ended(done, t0),
        sc.started(running, t0, "erin", ["n2:0", "n2:1"], node="n2"),
        *sc.gpu_records(running, ticks, {0, 1}, t0, node="n2", ticks_to=HALF),
        sc.started(power_only, t0, "fay", ["n3:2"], node="n3"),
        *sc.gpu_records(power_only, ticks, {2}, t0, node="n3", ticks_to=HALF),
    ], cluster)
    whole = sum(sc.counter_j(g, 0, (sc.TICKS - 1) * sc.INTERVAL_S) for g in sc.COUNTER_GPUS) / J_PER_KWH
    so_far = sum(sc.counter_j(g, 0, HALF_S) for g in sc.COUNTER_GPUS) / J_PER_KWH
    # GPU 2 has no counter: its mean power times its sampled span, near its trapezoids.
    power = sc.power_integral_j(0, HALF_S) / J_PER_KWH

    now = dt.datetime.now(dt.UTC)
    start, end = now - dt.timedelta(hours=2), now + dt.timedelta(hours=1)
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        by_user = {r["name"]: r for r in audit_queries.gpu_hours_by(conn, "user_name", start, end, cluster=cluster,
                                                                    now=now)}
        by_partition = audit_queries.gpu_hours_by(conn, "partition", start, end, cluster=cluster, now=now)
        totals = audit_queries.audit_totals(conn, start, end, cluster=cluster, now=now)
        by_account = audit_queries.gpu_hours_by(conn, "account", start, end, cluster=cluster, now=now)
    # A running job's energy counts in full: the period holds its whole run so far.
    assert by_user["erin"]["jobs"] == 2 and by_user["erin"]["running_jobs"] == 1
    assert by_user["erin"]["energy_kwh"] == pytest.approx(whole + so_far, rel=1e-9)
    assert by_user["fay"]["running_jobs"] == 1 and by_user["fay"]["energy_kwh"] == pytest.approx(power, rel=0.03)
    assert [(r["name"], r["running_jobs"]) for r in by_partition] == [("gpu", 2)]
    assert {r["name"]: r["running_jobs"] for r in by_account} == {"acct-erin": 1, "acct-fay": 1}
    assert totals["running_jobs"] == 2
    assert totals["energy_kwh"] == pytest.approx(whole + so_far + by_user["fay"]["energy_kwh"], rel=1e-9)
