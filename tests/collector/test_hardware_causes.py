"""Why a rank is slow or hung, and which GPUs keep hurting jobs: a 2-node × 4-GPU job whose GPUs
are read from the fake libnvidia-ml.so.1 through the real pynvml (samples and Xid events, as the
node daemon reads them), with its eight ranks' step records and start events as the Lightning
callback sends them, through the ingest path; the health evaluator over the real database.

Rank r runs on node r // 4, GPU r % 4 (its ``fit_start`` says ``local_rank``).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from jobsight.agent.node.gpu.sampler import NvmlSampler
from jobsight.collector.config.alerts import load_alert_settings
from jobsight.collector.config.health import load_health_settings
from jobsight.collector.passes.findings import HealthEvaluator
from jobsight.collector.passes.notices import notice_key
from jobsight.collector.passes.suspects import alert_suspects
from jobsight.collector.query.suspects import suspect_gpus
from jobsight.protocol.tokens import mint_job_token
from jobsight.rules.report_text import format_report
from tests.collector.helpers import SECRET, gz, post

RANKS = 8
STEP_S = 0.5
GPU: dict[str, Any] = {
    "name": "NVIDIA H100 80GB HBM3", "util_gpu": 96, "util_mem": 40, "mem_total": 85520809984,
    "mem_used": 60 * 2**30, "power_mw": 610_000, "energy_mj": 10**9, "temp_c": 62, "sm_clock_mhz": 1980,
    "mem_clock_mhz": 2619, "pcie_tx_kbs": 1000, "pcie_rx_kbs": 2000, "throttle_reasons": 0,
    "ecc_corrected": 0, "ecc_uncorrected": 0, "processes": [], "pcie_replays": 0,
    "nvlink": [{"crc_flit": 0, "crc_data": 0, "replay": 0, "recovery": 0} for _ in range(4)],
}
THERMAL = {"sm_clock_mhz": 990, "temp_c": 87, "throttle_reasons": 0x20 | 0x40, "power_mw": 420_000}


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as c:
        yield c


def nodes(job: str) -> tuple[str, str]:
    return f"{job}-a", f"{job}-b"


def scenario(node_no: int, changes: dict[int, dict[str, Any]]) -> dict[str, Any]:
    gpus = []
    for index in range(4):
        gpu = copy.deepcopy(GPU)
        gpu["uuid"] = f"GPU-{node_no}{index}000000-aaaa-bbbb-cccc-00000000000{index}"
        gpu.update(changes.get(index, {}))
        gpus.append(gpu)
    return {"driver_version": "550.54.15", "gpus": gpus}


def read_gpus(fake_library: Path, tmp_path: Path, job: str, node: str, spec: dict[str, Any], start_us: int,
              seconds: int) -> list[dict[str, Any]]:
    """What the node daemon sends for the job: a ``gpu_sample`` per GPU a second, and a ``gpu_event``
    per Xid the tick read, from the real pynvml over the fake library."""
    path = tmp_path / f"{node}.json"
    path.write_text(json.dumps(spec))
    before = os.environ.get("FAKE_NVML_SCENARIO")
    os.environ["FAKE_NVML_SCENARIO"] = str(path)
    records: list[dict[str, Any]] = []
    try:
        with NvmlSampler(library_path=str(fake_library), events=True) as sampler:
            for tick in range(seconds):
                ts = start_us + tick * 1_000_000
                for reading in sampler.sample():
                    records.append({**reading.to_record(), "kind": "gpu_sample", "job": job, "node": node, "ts": ts})
                for event in sampler.events():
                    records.append({"kind": "gpu_event", "job": job, "node": node, "ts": ts,
                                    "gpu_index": event.gpu_index, "gpu_uuid": event.gpu_uuid, "event": event.event,
                                    "code": event.code})
    finally:
        if before is None:
            del os.environ["FAKE_NVML_SCENARIO"]
        else:
            os.environ["FAKE_NVML_SCENARIO"] = before
    return records


def ranks_records(job: str, start_us: int, seconds: float, forward: dict[int, float],
                  stop_at: dict[int, float] | None = None) -> list[dict[str, Any]]:
    """Each rank's ``fit_start`` and its steps: in lock step (the all-reduce), each step as long as
    the slowest rank's forward makes it; ``forward`` scales a rank's forward pass; ``stop_at``: a
    rank's last step ends by then (seconds from the start)."""
    a, b = nodes(job)
    out: list[dict[str, Any]] = []
    for rank in range(RANKS):
        node, local = (a, b)[rank // 4], rank % 4
        out.append({"kind": "log", "job": job, "ts": start_us, "node": node, "rank": rank, "pid": 1000 + rank,
                    "level": "INFO", "logger": "jobsight.run", "message": f"fit started on rank {rank} of {RANKS}",
                    "attrs": {"event": "fit_start", "local_rank": local, "device": "cpu", "world_size": RANKS}})
    slowest = max(forward.values(), default=1.0)
    step_s = STEP_S * (0.6 + 0.4 * slowest)
    t, step = 0.0, 0
    while t + step_s <= seconds:
        t += step_s
        step += 1
        for rank in range(RANKS):
            if stop_at and t > stop_at.get(rank, seconds):
                continue
            out.append({"kind": "step", "job": job, "ts": start_us + int(t * 1e6), "node": (a, b)[rank // 4],
                        "rank": rank, "pid": 1000 + rank, "step": step, "epoch": 0, "phase": "train",
                        "duration_s": step_s, "data_wait_s": 0.01, "forward_s": 0.2 * forward.get(rank, 1.0)})
    return out


def started(job: str, ts: int) -> list[dict[str, Any]]:
    return [{"kind": "job_started", "job": job, "ts": ts, "node": node, "user": "ana", "account": "ml",
             "partition": "gpu", "nodes": list(nodes(job)), "gpus": ["0", "1", "2", "3"]} for node in nodes(job)]


def run_job(client: Any, fake_library: Path, tmp_path: Path, job: str, start_us: int, seconds: int,
            changes: tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]]], forward: dict[int, float],
            stop_at: dict[int, float] | None = None) -> None:
    records = started(job, start_us)
    for node_no, node in enumerate(nodes(job)):
        records += read_gpus(fake_library, tmp_path, job, node, scenario(node_no, changes[node_no]), start_us, seconds)
    records += ranks_records(job, start_us, seconds, forward, stop_at)
    for i in range(0, len(records), 5000):
        response = post(client, gz(records[i:i + 5000]))
        assert response.status_code == 200, response.text


def opened(conn: psycopg.Connection[dict[str, Any]], job: str, now: float, **thresholds: Any) -> dict[str, Any]:
    health = HealthEvaluator(load_health_settings(straggler_window_s=120, hung_min_s=30, **thresholds))
    return {(f["rule"], f["subject"]): f for f in health.evaluate_once(conn, now).opened if f["job_id"] == job}


def test_a_gpu_in_thermal_slowdown_makes_its_rank_a_straggler_and_the_finding_says_so(
    client: Any, conn: psycopg.Connection[dict[str, Any]], fake_library: Path, tmp_path: Path, job_id: str
) -> None:
    now = time.time()
    start = int((now - 130) * 1e6)
    # Node b's GPU 1 (rank 5) is held at half its clocks, hot: its forward pass takes twice as long.
    run_job(client, fake_library, tmp_path, job_id, start, 130, ({}, {1: THERMAL}), {5: 2.0})
    found = opened(conn, job_id, now)
    assert set(found) == {("straggler", "rank 5")}, found
    f = found[("straggler", "rank 5")]
    assert f["gpu"] == f"{nodes(job_id)[1]}/1" and f["node"] == nodes(job_id)[1]
    cause = f["evidence"]["cause"]
    assert cause["kind"] == "clocks" and cause["slowed_by"] == ["thermal_slowdown"]
    assert cause["sm_clock_mhz"] == 990 and cause["others_sm_clock_mhz"] == 1980
    assert ("Rank 5's GPU (" + f["gpu"] + ") ran at 990 MHz against 1,980 MHz on the others: thermal slowdown "
            "for 100 % of the window at 87 °C.") in f["message"], f["message"]
    assert "Check its node, GPU clocks and data shard." not in f["message"]
    # The report (and the page's banner, from the same answer) says it.
    answer = client.get(f"/v1/jobs/{job_id}/findings").json()
    text = format_report(client.get(f"/v1/jobs/{job_id}").json(), answer)
    assert "thermal slowdown for 100 % of the window at 87 °C" in text


def test_a_slow_rank_on_healthy_hardware_is_told_so_not_given_a_made_up_cause(
    client: Any, conn: psycopg.Connection[dict[str, Any]], fake_library: Path, tmp_path: Path, job_id: str
) -> None:
    now = time.time()
    start = int((now - 130) * 1e6)
    run_job(client, fake_library, tmp_path, job_id, start, 130, ({}, {}), {6: 2.0})
    f = opened(conn, job_id, now)[("straggler", "rank 6")]
    assert f["evidence"]["cause"]["kind"] == "none"
    assert f["message"].endswith(
        f"Nothing in the hardware differs: its GPU ({nodes(job_id)[1]}/2) ran at 1,980 MHz like the others "
        "(1,980 MHz), with no throttle reason held, no Xid and no link errors. Look at its data shard or its code "
        "(the profile window shows where its step goes)."), f["message"]
    for word in ("thermal", "power", "Xid 79", "NVLink"):
        assert word not in f["message"]


def test_a_slow_rank_whose_gpu_clocks_higher_than_the_others_is_not_said_to_run_like_them(
    client: Any, conn: psycopg.Connection[dict[str, Any]], fake_library: Path, tmp_path: Path, job_id: str
) -> None:
    """Every GPU but rank 6's at 990 MHz (held by nothing NVML names, as when the others idle in a
    collective), rank 6's at 1,980 MHz: the words follow the numbers ("faster", not "like")."""
    now = time.time()
    start = int((now - 130) * 1e6)
    low = {"sm_clock_mhz": 990}
    run_job(client, fake_library, tmp_path, job_id, start, 130,
            ({i: low for i in range(4)}, {i: low for i in (0, 1, 3)}), {6: 2.0})
    f = opened(conn, job_id, now)[("straggler", "rank 6")]
    assert f["evidence"]["cause"]["kind"] == "none"
    assert f["evidence"]["cause"]["sm_clock_mhz"] == 1980
    assert f["message"].endswith(
        f"Nothing in its hardware slows it: its GPU ({nodes(job_id)[1]}/2) ran at 1,980 MHz, faster than the "
        "others (990 MHz), with no throttle reason held, no Xid and no link errors. Look at its data shard or its "
        "code (the profile window shows where its step goes)."), f["message"]
    assert "like the others" not in f["message"]


def test_an_xid_79_then_its_ranks_silence_is_a_hung_finding_naming_the_xid_the_gpu_and_the_time(
    client: Any, conn: psycopg.Connection[dict[str, Any]], fake_library: Path, tmp_path: Path, job_id: str
) -> None:
    now = time.time()
    start_s = now - 200
    # Node a's GPU 2 (rank 2) reports Xid 79 at its 60th tick and is gone; rank 2's last step ends
    # 20 s later, the others block in the all-reduce a step after.
    lost = {"xids": [{"tick": 60, "code": 79}], "lost_after_tick": 60}
    run_job(client, fake_library, tmp_path, job_id, int(start_s * 1e6), 200, ({2: lost}, {}), {},
            stop_at={**{r: 81.0 for r in range(RANKS)}, 2: 80.0})
    found = opened(conn, job_id, now)
    assert set(found) == {("hung_rank", "")}, found
    f = found[("hung_rank", "")]
    gpu = f"{nodes(job_id)[0]}/2"
    xid_at = conn.execute("SELECT ts FROM gpu_events WHERE job_id = %s", (job_id,)).fetchone()
    assert xid_at is not None
    at = xid_at["ts"]
    assert at == dt.datetime.fromtimestamp(int(start_s * 1e6) // 1_000_000 + 59, dt.UTC).replace(
        microsecond=int(start_s * 1e6) % 1_000_000)
    assert f["rank"] == 2 and f["gpu"] == gpu
    assert f["evidence"]["cause"]["kind"] == "xid" and f["evidence"]["cause"]["xid"] == 79
    assert (f"Rank 2 hung 21 s after Xid 79 (GPU fell off the bus) on {gpu} at {at:%H:%M:%S} UTC."
            in f["message"]), f["message"]


def test_a_gpu_whose_nvlink_crc_errors_grow_across_three_jobs_is_a_suspect_with_those_jobs(
    client: Any, conn: psycopg.Connection[dict[str, Any]], fake_library: Path, tmp_path: Path, job_id: str,
) -> None:
    now = time.time()
    growing = {"nvlink": [{"crc_flit": [0, 4, 9, 15, 22, 30], "crc_data": 0, "replay": 0, "recovery": 0},
                          *GPU["nvlink"][1:]]}
    jobs = [f"{job_id}-{n}" for n in range(3)]
    node = f"{job_id}-b"
    for n, job in enumerate(jobs):
        start = int((now - 600 + n * 100) * 1e6)
        records = [{"kind": "job_started", "job": job, "ts": start, "node": node, "user": "ana", "account": "ml",
                    "partition": "gpu", "nodes": [node], "gpus": ["3"]},
                   *read_gpus(fake_library, tmp_path, job, node, scenario(1, {3: growing}), start, 30),
                   {"kind": "job_ended", "job": job, "ts": start + 31_000_000, "node": node, "state": "completed",
                    "exit_code": 0}]
        assert post(client, gz(records)).status_code == 200
    # Another GPU of the same node, in a fourth job, never counted one: not a suspect.
    clean = f"{job_id}-clean"
    start = int((now - 200) * 1e6)
    assert post(client, gz([
        {"kind": "job_started", "job": clean, "ts": start, "node": node, "user": "ana", "gpus": ["0"]},
        *[r for r in read_gpus(fake_library, tmp_path, clean, node, scenario(1, {}), start, 30)
          if r["gpu_index"] == 0],
        {"kind": "job_ended", "job": clean, "ts": start + 31_000_000, "node": node, "state": "completed"},
    ])).status_code == 200

    until = dt.datetime.now(dt.UTC)
    mine = [g for g in suspect_gpus(conn, until - dt.timedelta(days=7), until) if g.node == node]
    assert [(g.gpu, sorted(g.jobs), g.faults) for g in mine] == [(f"{node}/3", jobs, {"nvlink_crc_errors": 90})]
    assert mine[0].drain_line() == (f"scontrol update NodeName={node} State=DRAIN "
                                    "Reason='jobsight: GPU 3 hurt 3 jobs (90 nvlink_crc_errors)'")

    listed = client.get("/v1/suspect-gpus")
    assert listed.status_code == 200
    row = next(g for g in listed.json()["gpus"] if g["node"] == node)
    assert row["jobs"] == jobs and row["job_count"] == 3 and row["drain"] == mine[0].drain_line()

    # Over the site's threshold (3 jobs): one notice to the site's sinks this week, not two.
    health = load_health_settings(suspect_alert_jobs=3)
    alerts = load_alert_settings(sinks=[{"name": "ops", "url": "json://localhost:9/hook"}])
    assert alert_suspects(conn, health, alerts, now) >= 1
    assert alert_suspects(conn, health, alerts, now) == 0
    notice = conn.execute("SELECT kind, sink, title, lines FROM notices WHERE key = %s",
                          (notice_key("suspect", "default", f"{node}/3", f"{until:%G}-W{until:%V}"),)).fetchone()
    assert notice is not None and notice["kind"] == "suspect" and notice["sink"] == "ops"
    assert any(mine[0].drain_line() in json.dumps(line) for line in notice["lines"]["lines"]), notice["lines"]


def test_the_suspect_list_is_for_admins(secret_client: Any, job_id: str) -> None:
    """It names every user's jobs: a job's own token (its user) gets 403, not the list."""
    own = {"Authorization": f"Bearer {mint_job_token(SECRET, 'default', job_id, 3600, uid=1001)}"}
    answer = secret_client.get("/v1/suspect-gpus", headers=own)
    assert answer.status_code == 403 and "admins" in answer.text


def test_a_hostile_node_name_gets_no_drain_line() -> None:
    from jobsight.collector.query.suspects import SuspectGpu

    gpu = SuspectGpu("default", "n1;reboot", 0, xids={79: 1}, jobs={"1"})
    assert gpu.drain_line() is None
    assert SuspectGpu("default", "gpu-a1", 0, xids={79: 1}, jobs={"1"}).drain_line() == (
        "scontrol update NodeName=gpu-a1 State=DRAIN Reason='jobsight: GPU 0 hurt 1 jobs "
        "(Xid 79 (GPU fell off the bus) ×1)'")
