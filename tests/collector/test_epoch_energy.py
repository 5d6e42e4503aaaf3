"""Energy per epoch (``GET /v1/jobs/{job}/epochs``) on GPUs read by the real node sampler over the
fake libnvidia-ml.so.1, against the counter deltas and power readings the scenario gave it
(tests/collector/energy_scenario.py)."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from jobsight.agent.node.gpu.reading import GpuReading
from jobsight.collector.query import epoch_steps
from jobsight.collector.query.epoch_energy import BOTH, COUNTER, POWER_INTEGRAL
from jobsight.collector.store import migrate
from jobsight.collector.store.embedded_db import EmbeddedPostgres
from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.tiers import compaction
from jobsight.protocol.wire import now_us
from tests.collector import energy_scenario as sc
from tests.conftest import create_database

J_PER_KWH = 3.6e6
MINUTE = 60 * sc.S


@pytest.fixture
def ticks(fake_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[GpuReading]]:
    return sc.sample_scenario(fake_library, tmp_path, monkeypatch)


def _t0() -> int:
    """An hour ago, 40 s into a minute: the run's 150 s cross minute boundaries."""
    return (now_us() // MINUTE - 60) * MINUTE + 40 * sc.S


def _ended_job(client: Any, job: str, ticks: list[list[GpuReading]], gpus: set[int], t0: int) -> dict[str, Any]:
    sc.send(client, [sc.started(job, t0, "erin", [f"n1:{g}" for g in sorted(gpus)]),
                     *sc.gpu_records(job, ticks, gpus, t0), *sc.step_records(job, t0), sc.ended(job, t0)])
    answer = client.get(f"/v1/jobs/{job}/epochs")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def _job_energy_j(client: Any, job: str) -> float:
    summary = client.get(f"/v1/jobs/{job}/summary").json()
    assert summary["final"] is True
    return float(summary["summary"]["energy_kwh"]) * J_PER_KWH


def test_epoch_energy_is_the_counter_deltas_and_adds_up_to_the_job(
    client: Any, job_id: str, ticks: list[list[GpuReading]]
) -> None:
    t0 = _t0()
    answer = _ended_job(client, job_id, ticks, {0, 1}, t0)
    assert answer["running"] is False and answer["method"] == COUNTER
    assert answer["gpus"] == {COUNTER: 2, POWER_INTEGRAL: 0}
    epochs = answer["epochs"]
    assert [e["epoch"] for e in epochs] == [0, 1, 2]
    for row, (epoch, first_s, end_s) in zip(epochs, sc.epoch_spans_s(), strict=True):
        expected = sum(sc.counter_j(g, first_s, end_s) for g in sc.COUNTER_GPUS)
        assert row["energy_j"] == pytest.approx(expected, rel=1e-9), epoch
        assert row["energy_kwh"] == pytest.approx(expected / J_PER_KWH, rel=1e-9)
        steps = end_s - first_s + (1 if epoch == 2 else 0)  # the last epoch ends on its last step
        assert row["duration_s"] == pytest.approx(end_s - first_s)
        assert row["steps"] == steps and row["samples"] == steps * len(sc.RANKS) * sc.SAMPLES_PER_STEP
        assert row["samples_per_s"] == pytest.approx(row["samples"] / (end_s - first_s))
        assert row["j_per_sample"] == pytest.approx(expected / row["samples"], rel=1e-9)
        assert row["method"] == COUNTER and row["growing"] is False
    before, after = answer["before_first_epoch"], answer["after_last_step"]
    assert before["energy_j"] == pytest.approx(sum(sc.counter_j(g, 0, 10) for g in sc.COUNTER_GPUS), rel=1e-9)
    assert after["energy_j"] == pytest.approx(sum(sc.counter_j(g, 140, 150) for g in sc.COUNTER_GPUS), rel=1e-9)

    job_j = _job_energy_j(client, job_id)
    in_epochs = sum(e["energy_j"] for e in epochs)
    # Start-up and the idle tail are short here: the epochs alone are the job's energy within 1 %.
    assert in_epochs == pytest.approx(job_j, rel=0.01)
    # With them, every joule is counted once: the spans tile the run.
    assert in_epochs + before["energy_j"] + after["energy_j"] == pytest.approx(job_j, rel=1e-9)
    assert answer["energy_j"] == pytest.approx(job_j, rel=1e-9)


def test_gpu_without_a_counter_gets_the_power_integral_and_says_so(
    client: Any, job_id: str, ticks: list[list[GpuReading]]
) -> None:
    t0 = _t0()
    assert all(r.energy_j is None for tick in ticks for r in tick if r.gpu_index == 2)  # the fake has no counter
    answer = _ended_job(client, job_id, ticks, {2}, t0)
    assert answer["method"] == POWER_INTEGRAL and answer["gpus"] == {COUNTER: 0, POWER_INTEGRAL: 1}
    for row, (_, first_s, end_s) in zip(answer["epochs"], sc.epoch_spans_s(), strict=True):
        assert row["method"] == POWER_INTEGRAL
        assert row["energy_j"] == pytest.approx(sc.power_integral_j(first_s, end_s), rel=1e-9)
    summary = client.get(f"/v1/jobs/{job_id}/summary").json()["summary"]
    assert summary["gpus"][0]["energy_source"] == "power"
    assert answer["energy_j"] == pytest.approx(summary["energy_kwh"] * J_PER_KWH, rel=1e-9)

    mixed = _ended_job(client, f"{job_id}-mixed", ticks, {0, 2}, t0)
    assert mixed["method"] == BOTH and mixed["gpus"] == {COUNTER: 1, POWER_INTEGRAL: 1}
    for row, (_, first_s, end_s) in zip(mixed["epochs"], sc.epoch_spans_s(), strict=True):
        assert row["method"] == BOTH
        assert row["energy_j"] == pytest.approx(sc.counter_j(0, first_s, end_s) + sc.power_integral_j(first_s, end_s),
                                                rel=1e-9)
    assert mixed["energy_j"] == pytest.approx(_job_energy_j(client, f"{job_id}-mixed"), rel=1e-9)


def test_sampling_slower_than_the_near_window_reads_the_minutes_around_a_boundary(
    client: Any, job_id: str, ticks: list[list[GpuReading]]
) -> None:
    t0, slower = _t0(), 6  # samples every 30 s: none within epoch_energy.NEAR after most boundaries
    sc.send(client, [*sc.gpu_records(job_id, ticks, {0, 1}, t0, slower=slower),
                     *sc.step_records(job_id, t0, slower=slower)])
    answer = client.get(f"/v1/jobs/{job_id}/epochs").json()
    # Every time is 6× later, so each boundary falls at the same share of its interval as before.
    for row, (_, first_s, end_s) in zip(answer["epochs"], sc.epoch_spans_s(), strict=True):
        assert row["energy_j"] == pytest.approx(sum(sc.counter_j(g, first_s, end_s) for g in sc.COUNTER_GPUS),
                                                rel=1e-9)


def test_a_job_stored_before_the_rollups_reads_the_same_from_its_rows(
    client: Any, db: psycopg.Connection[Any], job_id: str, ticks: list[list[GpuReading]]
) -> None:
    with_rollups = _ended_job(client, job_id, ticks, {0, 1, 2}, _t0())
    for table in ("gpu_hours", "step_minutes", "epoch_starts"):
        db.execute(f"DELETE FROM {table} WHERE job_id = %s", (job_id,))
    from_rows = client.get(f"/v1/jobs/{job_id}/epochs").json()
    assert from_rows["method"] == BOTH and from_rows["gpus"] == with_rollups["gpus"]
    for before, after in zip(with_rollups["epochs"], from_rows["epochs"], strict=True):
        assert after["energy_j"] == pytest.approx(before["energy_j"], rel=1e-9)
        assert [after[k] for k in ("epoch", "steps", "samples", "start", "end")] == [
            before[k] for k in ("epoch", "steps", "samples", "start", "end")]
    assert from_rows["energy_j"] == pytest.approx(with_rollups["energy_j"], rel=1e-9)


def test_many_boundary_minutes_are_shared_by_time_and_stay_close(
    client: Any, database_url: str, job_id: str
) -> None:
    t0 = _t0()
    sc.send(client, sc.step_records(job_id, t0))
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        exact = epoch_steps.job_epochs(conn, "default", job_id)
        shared = epoch_steps.job_epochs(conn, "default", job_id, raw_budget=0)
    assert [e.steps for e in exact] == [50, 42, 39]
    assert [(e.start, e.end) for e in shared] == [(e.start, e.end) for e in exact]
    for by_time, counted in zip(shared, exact, strict=True):
        assert abs(by_time.steps - counted.steps) <= 2 and by_time.samples is not None
    assert sum(e.steps for e in shared) == pytest.approx(sum(e.steps for e in exact), abs=2)


def test_an_epochs_read_lists_at_most_the_set_number_and_still_adds_up(
    client: Any, database_url: str, data_dir: Path, admin_token: str, job_id: str, ticks: list[list[GpuReading]]
) -> None:
    """A job sets its own epoch count: one read lists at most ``max_epochs_per_read`` (the latest) and
    gives the earlier ones as one span with their count, so the spans still tile the run."""
    from fastapi.testclient import TestClient

    from jobsight.collector.app import create_app
    from jobsight.collector.config.settings import load_collector_settings

    every = _ended_job(client, job_id, ticks, {0, 1}, _t0())
    assert every["epoch_count"] == 3 and every["epochs_left_out"] is None
    settings = load_collector_settings(database_url=database_url, data_dir=data_dir, max_epochs_per_read=2)
    with TestClient(create_app(settings)) as capped_client:
        capped_client.headers["Authorization"] = f"Bearer {admin_token}"
        capped = capped_client.get(f"/v1/jobs/{job_id}/epochs").json()
    assert capped["epoch_count"] == 3 and [e["epoch"] for e in capped["epochs"]] == [1, 2]
    for listed, full in zip(capped["epochs"], every["epochs"][1:], strict=True):
        assert listed["energy_j"] == pytest.approx(full["energy_j"], rel=1e-9)
        assert [listed[k] for k in ("epoch", "start", "end", "steps", "samples")] == [
            full[k] for k in ("epoch", "start", "end", "steps", "samples")]
    left_out, first = capped["epochs_left_out"], every["epochs"][0]
    assert left_out["epochs"] == 1 and (left_out["start"], left_out["end"]) == (first["start"], first["end"])
    assert left_out["energy_j"] == pytest.approx(first["energy_j"], rel=1e-9)
    assert left_out["steps"] is None and left_out["samples"] is None  # not counted: a bounded read
    assert capped["before_first_epoch"]["energy_j"] == pytest.approx(every["before_first_epoch"]["energy_j"], rel=1e-9)
    spans = [capped["before_first_epoch"], left_out, *capped["epochs"], capped["after_last_step"]]
    assert sum(span["energy_j"] for span in spans) == pytest.approx(capped["energy_j"], rel=1e-9)
    assert capped["energy_j"] == pytest.approx(every["energy_j"], rel=1e-9)


def test_job_without_epochs_or_gpus(client: Any, job_id: str) -> None:
    t0 = _t0()
    sc.send(client, [sc.started(job_id, t0, "erin", ["n1:0"])])
    answer = client.get(f"/v1/jobs/{job_id}/epochs").json()
    assert answer["epochs"] == [] and answer["energy_j"] is None and answer["method"] is None
    assert answer["before_first_epoch"] is None and answer["after_last_step"] is None
    assert client.get("/v1/jobs/no-such-job-anywhere/epochs").status_code == 404


@pytest.fixture(scope="module")
def packed_url(postgres: EmbeddedPostgres) -> str:
    """A database of its own: a compaction pass packs every job's closed days, not only this test's."""
    url = create_database(postgres, f"epochs_{uuid.uuid4().hex[:8]}")
    migrate.upgrade(url)
    return url


def test_epochs_read_the_same_from_the_packed_tier(
    packed_url: str, data_dir: Path, admin_token: str, job_id: str, ticks: list[list[GpuReading]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fastapi.testclient import TestClient

    from jobsight.collector.app import create_app
    from jobsight.collector.config.settings import load_collector_settings

    monkeypatch.setenv("JOBSIGHT_COMPACT_INTERVAL_S", "0")  # the pass runs when the test says
    t0 = _t0() - 2 * 24 * 60 * MINUTE  # two days ago: a closed day the pass packs
    with TestClient(create_app(load_collector_settings(database_url=packed_url, data_dir=data_dir))) as client:
        client.headers["Authorization"] = f"Bearer {admin_token}"
        hot = _ended_job(client, job_id, ticks, {0, 1, 2}, t0)
        with psycopg.connect(packed_url, autocommit=True, row_factory=dict_row) as conn:
            report = compaction.run_pass(conn, PartitionKeeper(), older_than=dt.timedelta(0), packed_retention_days=0)
            assert report.ran
            left = conn.execute("SELECT count(*) AS n FROM gpu_samples WHERE job_id = %s", (job_id,)).fetchone()
            assert left is not None and left["n"] == 0  # every sample is in the packed tier now
        packed = client.get(f"/v1/jobs/{job_id}/epochs").json()
    assert hot["method"] == BOTH and [e["epoch"] for e in packed["epochs"]] == [0, 1, 2]
    for before, after in zip(hot["epochs"], packed["epochs"], strict=True):
        assert after["energy_j"] == pytest.approx(before["energy_j"], rel=1e-12)
        assert [after[k] for k in ("steps", "samples", "start")] == [before[k] for k in ("steps", "samples", "start")]
    assert packed["energy_j"] == pytest.approx(hot["energy_j"], rel=1e-12)
