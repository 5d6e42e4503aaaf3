"""The health evaluator over the real database: GPUs read from the fake libnvidia-ml.so.1 by the
real pynvml at 0 % for the idle rule, steps through the ingest path for the hung rank, and what
a restart, a recovery and a job's end do to open findings. The rules' own edge cases are in
tests/rules/test_health_rules.py; real DDP runs in tests/frameworks/test_health_ddp.py."""

from __future__ import annotations

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
from jobsight.collector.config.health import load_health_settings
from jobsight.collector.passes.findings import HealthEvaluator
from jobsight.protocol.step_phases import BACKWARD, FORWARD, PendingPhase
from jobsight.rules.report_text import format_report
from tests.collector.helpers import gz, post

FAKE = Path(__file__).resolve().parents[1] / "fake_nvml" / "scenarios"
GiB = 2**30


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as c:
        yield c


def started(job: str, ts: int, **fields: Any) -> dict[str, Any]:
    return {"kind": "job_started", "job": job, "ts": ts, "node": "n1", "user": "alice", "account": "ml",
            "partition": "gpu", "gpus": ["0", "1"], **fields}


def idle_gpu_records(fake_library: Path, tmp_path: Path, job: str, now_us: int, span_s: int) -> list[dict[str, Any]]:
    """Two GPUs at 0 % using 1 GiB of 80, read through the real pynvml from the fake library,
    stamped one a second over the last ``span_s`` seconds."""
    scenario = json.loads((FAKE / "four_gpus.json").read_text())
    scenario["gpus"] = scenario["gpus"][:2]
    for gpu in scenario["gpus"]:
        gpu.update(util_gpu=0, mem_used=GiB, processes=[])
    path = tmp_path / "idle.json"
    path.write_text(json.dumps(scenario))
    before = os.environ.get("FAKE_NVML_SCENARIO")
    os.environ["FAKE_NVML_SCENARIO"] = str(path)
    records = []
    try:
        with NvmlSampler(library_path=str(fake_library)) as sampler:
            for tick in range(span_s + 1):
                for reading in sampler.sample():
                    record = reading.to_record()
                    record.update(kind="gpu_sample", job=job, node="n1", ts=now_us - (span_s - tick) * 1_000_000)
                    records.append(record)
    finally:
        if before is None:
            del os.environ["FAKE_NVML_SCENARIO"]
        else:
            os.environ["FAKE_NVML_SCENARIO"] = before
    return records


def evaluator(**thresholds: Any) -> HealthEvaluator:
    return HealthEvaluator(load_health_settings(**thresholds))


def open_findings(conn: psycopg.Connection[dict[str, Any]], job: str) -> list[dict[str, Any]]:
    return conn.execute("SELECT * FROM findings WHERE job_id = %s AND state = 'open' ORDER BY id", (job,)).fetchall()


def test_fake_nvml_gpus_at_zero_open_one_idle_finding_and_restarts_do_not_repeat_it(
    client: Any, conn: psycopg.Connection[dict[str, Any]], fake_library: Path, tmp_path: Path, job_id: str
) -> None:
    now = time.time()
    now_us = int(now * 1e6)
    records = [started(job_id, now_us - 60_000_000), *idle_gpu_records(fake_library, tmp_path, job_id, now_us, 40)]
    assert post(client, gz(records)).status_code == 200
    assert all(r["util_gpu"] == 0.0 for r in records[1:])

    first = evaluator(idle_min_s=30, low_util_window_s=30).evaluate_once(conn, now)
    opened = [f for f in first.opened if f["job_id"] == job_id]
    assert [(f["rule"], f["subject"]) for f in opened] == [("idle_allocation", ""), ("low_utilisation", "")]
    idle = opened[0]
    assert idle["evidence"]["idle_gpus"] == ["n1/0", "n1/1"] and idle["title"] == "2 of 2 GPUs idle"
    assert idle["evidence"]["max_util"] == {"n1/0": 0.0, "n1/1": 0.0}

    # A new evaluator (a restarted collector) and a second pass update it, never open it again.
    for _ in range(2):
        again = evaluator(idle_min_s=30, low_util_window_s=30).evaluate_once(conn, now + 1)
        assert not [f for f in again.opened if f["job_id"] == job_id]
    assert len(open_findings(conn, job_id)) == 2


def test_the_idle_rule_waits_for_the_whole_window(client: Any, conn: psycopg.Connection[dict[str, Any]],
                                                   fake_library: Path, tmp_path: Path, job_id: str) -> None:
    now = time.time()
    records = [started(job_id, int(now * 1e6) - 20_000_000),
               *idle_gpu_records(fake_library, tmp_path, job_id, int(now * 1e6), 10)]
    assert post(client, gz(records)).status_code == 200
    result = evaluator(idle_min_s=30, low_util_window_s=30).evaluate_once(conn, now)
    assert not [f for f in result.opened if f["job_id"] == job_id]


def steps(job: str, rank: int, start_us: int, count: int, step_s: float) -> list[dict[str, Any]]:
    return [
        {"kind": "step", "job": job, "ts": start_us + int(i * step_s * 1e6), "node": "n1", "rank": rank, "step": i,
         "epoch": 0, "duration_s": step_s, "forward_s": step_s / 2, "data_wait_s": 0.0}
        for i in range(count)
    ]


def test_a_rank_that_stops_while_the_other_steps_is_hung_then_recovers_then_the_job_ends(
    client: Any, conn: psycopg.Connection[dict[str, Any]], job_id: str
) -> None:
    now = time.time()
    t0 = int(now * 1e6) - 30_000_000
    records = [started(job_id, t0), *steps(job_id, 0, t0, 60, 0.5), *steps(job_id, 1, t0, 10, 0.5)]
    assert post(client, gz(records)).status_code == 200
    health = evaluator(hung_min_s=5)

    opened = [f for f in health.evaluate_once(conn, now).opened if f["job_id"] == job_id]
    assert [(f["rule"], f["subject"], f["rank"]) for f in opened] == [("hung_rank", "rank 1", 1)]
    assert opened[0]["evidence"]["silent_s"] == pytest.approx(25.5, abs=1.0)
    assert opened[0]["evidence"]["median_step_s"] == pytest.approx(0.5)

    # Rank 1 steps again: resolved, with the resolve time set.
    assert post(client, gz(steps(job_id, 1, int(now * 1e6) - 1_000_000, 2, 0.5))).status_code == 200
    resolved = [f for f in health.evaluate_once(conn, now + 1).resolved if f["job_id"] == job_id]
    assert [(f["rule"], f["state"]) for f in resolved] == [("hung_rank", "resolved")]
    assert resolved[0]["resolved_at"] is not None

    # 40 s on, no rank has stepped: one finding for the whole job (the old one stays as history).
    reopened = health.evaluate_once(conn, now + 40)
    assert [(f["rule"], f["subject"]) for f in reopened.opened if f["job_id"] == job_id] == [("hung_rank", "")]
    assert [f["title"] for f in open_findings(conn, job_id)] == ["Job looks hung"]
    # Then the job ends, which resolves it.
    ended = {"kind": "job_ended", "job": job_id, "ts": int(now * 1e6), "node": "n1", "state": "COMPLETED"}
    assert post(client, gz([ended])).status_code == 200
    health.evaluate_once(conn, now + 41)
    assert open_findings(conn, job_id) == []
    history = conn.execute("SELECT state FROM findings WHERE job_id = %s", (job_id,)).fetchall()
    assert history and all(row["state"] == "resolved" for row in history)


def test_a_job_that_used_little_gpu_memory_gets_a_memory_unused_verdict_once_at_its_end(
    client: Any, conn: psycopg.Connection[dict[str, Any]], fake_library: Path, tmp_path: Path, job_id: str
) -> None:
    now = time.time()
    now_us = int(now * 1e6)
    records = [started(job_id, now_us - 20_000_000), *idle_gpu_records(fake_library, tmp_path, job_id, now_us, 5)]
    assert post(client, gz(records)).status_code == 200
    health = evaluator()
    health.evaluate_once(conn, now)  # seen running
    ended = {"kind": "job_ended", "job": job_id, "ts": now_us, "node": "n1", "state": "COMPLETED"}
    assert post(client, gz([ended])).status_code == 200
    verdict = [f for f in health.evaluate_once(conn, now + 1).opened if f["job_id"] == job_id]
    assert [(f["rule"], f["state"]) for f in verdict] == [("memory_unused", "resolved")]
    assert verdict[0]["evidence"]["peak_share_by_gpu"]["n1/0"] == pytest.approx(GiB / 85520809984, abs=1e-4)
    assert not health.evaluate_once(conn, now + 2).opened


def test_findings_api_job_and_cluster_views(client: Any, conn: psycopg.Connection[dict[str, Any]], job_id: str) -> None:
    now = time.time()
    t0 = int(now * 1e6) - 30_000_000
    assert post(client, gz([started(job_id, t0), *steps(job_id, 0, t0, 4, 0.5)])).status_code == 200
    evaluator(hung_min_s=5).evaluate_once(conn, now)
    job = client.get(f"/v1/jobs/{job_id}/findings").json()["findings"]
    assert [(f["rule"], f["subject"], f["state"]) for f in job] == [("hung_rank", "", "open")]
    listed = client.get("/v1/findings", params={"state": "open", "rule": "hung_rank"}).json()
    mine = [f for f in listed["findings"] if f["job_id"] == job_id]
    assert mine and mine[0]["user_name"] == "alice" and mine[0]["partition"] == "gpu"
    # `jobsight report` prints the same findings.
    text = format_report(client.get(f"/v1/jobs/{job_id}").json(), {"findings": job})
    assert "Health" in text and "[critical] Job looks hung (hung_rank; opened" in text
    assert client.get("/v1/findings", params={"state": "sideways"}).status_code == 422
    assert client.get("/v1/findings", headers={"Authorization": "Bearer nope"}).status_code == 401


def phase_report(job: str, rank: int, step: int, phase: str, since_us: int, sent_us: int) -> dict[str, Any]:
    """The log record a rank's step watch sends (agent/training/step_watch.py)."""
    return {"kind": "log", "job": job, "ts": sent_us, "node": "n1", "rank": rank, "pid": 100 + rank, "level": "INFO",
            "logger": "jobsight.run", "message": f"step {step} has been in {phase} for 30 s",
            "attrs": PendingPhase(step, phase, since_us / 1e6).attrs()}


def test_a_hung_job_names_the_rank_still_in_its_forward_pass_once_the_phases_arrive(
    client: Any, conn: psycopg.Connection[dict[str, Any]], job_id: str
) -> None:
    now = time.time()
    t0 = int(now * 1e6) - 60_000_000
    # Synchronous DDP: both ranks made 40 steps of 0.5 s and stopped together, rank 0's last step
    # a millisecond earlier; its own work looked slower over the window (a straggler, but for the hang).
    rank0 = [{**r, "ts": r["ts"] - 1000, "forward_s": 0.45} for r in steps(job_id, 0, t0, 40, 0.5)]
    records = [started(job_id, t0), *rank0, *steps(job_id, 1, t0, 40, 0.5)]
    assert post(client, gz(records)).status_code == 200
    last = t0 + int(39 * 0.5 * 1e6)
    health = evaluator(hung_min_s=5)
    stepping = [f for f in health.evaluate_once(conn, last / 1e6 + 1).opened if f["job_id"] == job_id]
    assert [(f["rule"], f["subject"]) for f in stepping] == [("straggler", "rank 0")]
    # No rank steps any more: the job looks hung, and a rank that may only be waiting is no straggler.
    first = health.evaluate_once(conn, now)
    [hung] = [f for f in first.opened if f["job_id"] == job_id]
    assert (hung["rule"], hung["subject"]) == ("hung_rank", "")
    assert "rank 0 stopped first" in hung["message"], "no phases yet: today's words"
    assert [f["rule"] for f in first.resolved if f["job_id"] == job_id] == ["straggler"]

    # The step watches report: rank 1 is still in the forward pass of step 40, rank 0 waits in
    # backward; an older report of rank 1's, from before its last step, is over.
    reports = [phase_report(job_id, 1, 39, FORWARD, last - 400_000, last - 100),
               phase_report(job_id, 0, 40, BACKWARD, last + 200_000, last + 30_000_000),
               phase_report(job_id, 1, 40, FORWARD, last + 50_000, last + 30_000_000)]
    assert post(client, gz(reports)).status_code == 200
    again = health.evaluate_once(conn, now + 1)
    assert not [f for f in again.opened if f["job_id"] == job_id], "the same finding, updated"
    [finding] = open_findings(conn, job_id)
    assert finding["rank"] == 1 and finding["evidence"]["behind"] == [1] and finding["evidence"]["waiting"] == [0]
    assert "rank 1 is still in the forward pass of step 40" in finding["message"]
    assert "rank 0 is in backward of step 40" in finding["message"]
    assert not [f for f in open_findings(conn, job_id) if f["rule"] == "straggler"]

    # The stuck rank's own phase report from before its last step alone says nothing of now.
    stale = evaluator(hung_min_s=5)
    conn.execute("DELETE FROM log_events WHERE job_id = %s AND rank = 1 AND ts > %s",
                 (job_id, dt.datetime.fromtimestamp(last / 1e6, dt.UTC)))
    stale.evaluate_once(conn, now + 2)
    [finding] = open_findings(conn, job_id)
    assert finding["rank"] is None and "rank 1 stopped first" in finding["message"]
    assert "rank 1 said nothing" in finding["message"]


def run_end(job: str, rank: int | None, ts_us: int) -> dict[str, Any]:
    """The event a rank's ``finish()`` sends (agent/training/torch.py): it is done, not hung."""
    return {"kind": "log", "job": job, "ts": ts_us, "node": "n1", "rank": rank, "pid": 100 + (rank or 0),
            "level": "INFO", "logger": "jobsight.run", "message": "run finished", "attrs": {"event": "run_end"}}


def test_a_finished_run_whose_steps_name_no_rank_is_never_called_hung(
    client: Any, conn: psycopg.Connection[dict[str, Any]], job_id: str
) -> None:
    """A plain script outside Slurm: steps without a rank, then nothing (its process ended without a
    word); its job still runs. No rank can be named, so no "Job looks hung" blaming "rank -1"."""
    now = time.time()
    t0 = int(now * 1e6) - 600_000_000
    unnamed = [{k: v for k, v in r.items() if k != "rank"} for r in steps(job_id, 0, t0, 40, 0.5)]
    assert post(client, gz([started(job_id, t0), *unnamed])).status_code == 200
    assert conn.execute("SELECT DISTINCT rank FROM step_minutes WHERE job_id = %s", (job_id,)).fetchall() == [
        {"rank": -1}]
    result = evaluator(hung_min_s=5).evaluate_once(conn, now)
    assert [f for f in result.opened if f["job_id"] == job_id] == []
    assert open_findings(conn, job_id) == []


def test_ranks_that_said_they_ended_are_never_hung(client: Any, conn: psycopg.Connection[dict[str, Any]],
                                                   job_id: str) -> None:
    now = time.time()
    t0 = int(now * 1e6) - 300_000_000
    records = [started(job_id, t0), *steps(job_id, 0, t0, 40, 0.5), *steps(job_id, 1, t0, 40, 0.5)]
    ended = t0 + 21_000_000
    assert post(client, gz([*records, run_end(job_id, 0, ended), run_end(job_id, 1, ended)])).status_code == 200
    health = evaluator(hung_min_s=5)
    assert [f for f in health.evaluate_once(conn, now).opened if f["job_id"] == job_id] == []
    # Only rank 0 said so: the job looks hung, and rank 1 is the one named.
    other = f"{job_id}-b"
    assert post(client, gz([started(other, t0), *steps(other, 0, t0, 40, 0.5), *steps(other, 1, t0, 40, 0.5),
                            run_end(other, 0, ended)])).status_code == 200
    [hung] = [f for f in health.evaluate_once(conn, now).opened if f["job_id"] == other]
    assert hung["rule"] == "hung_rank" and list(hung["evidence"]["ranks"]) == ["1"]
    assert "rank 1 stopped first" in hung["message"]


def test_a_straggler_that_then_hangs_stays_open_while_its_rank_is_hung(
    client: Any, conn: psycopg.Connection[dict[str, Any]], job_id: str
) -> None:
    """The demo's story: rank 1 falls behind, then hangs and the others wait for it in the all-reduce.
    The straggler finding does not resolve (nor send its resolve alert) while the hung finding names
    rank 1: it says so instead, and resolves with the job."""
    now = time.time()
    t0 = int(now * 1e6) - 400_000_000
    rank1 = [{**r, "ts": r["ts"] - 1000, "forward_s": 0.45} for r in steps(job_id, 1, t0, 400, 0.5)]
    records = [started(job_id, t0), *steps(job_id, 0, t0, 400, 0.5), *rank1, *steps(job_id, 2, t0, 400, 0.5)]
    assert post(client, gz(records)).status_code == 200
    last = t0 + int(399 * 0.5 * 1e6)
    events: list[tuple[str, str]] = []

    def enqueue(_conn: Any, finding: Any, event: str, _job: Any) -> int:
        if finding["job_id"] == job_id:
            events.append((finding["rule"], event))
        return 1

    health = HealthEvaluator(load_health_settings(hung_min_s=5, straggler_window_s=60), enqueue)
    health.evaluate_once(conn, last / 1e6 + 1)
    assert events == [("straggler", "opened")]

    # Rank 1 stays in the forward pass of its next step; ranks 0 and 2 wait in backward's all-reduce.
    reports = [phase_report(job_id, 1, 400, FORWARD, last + 50_000, last + 30_000_000),
               *(phase_report(job_id, r, 400, BACKWARD, last + 200_000, last + 30_000_000) for r in (0, 2))]
    assert post(client, gz(reports)).status_code == 200
    for later_s in (100, 160):  # past the straggler window: no step in it, the rule alone would let go
        result = health.evaluate_once(conn, last / 1e6 + later_s)
        assert not [f for f in result.resolved if f["job_id"] == job_id]
    assert events == [("straggler", "opened"), ("hung_rank", "opened")]
    by_rule = {f["rule"]: f for f in open_findings(conn, job_id)}
    assert by_rule["hung_rank"]["rank"] == 1 and by_rule["straggler"]["rank"] == 1
    assert by_rule["straggler"]["message"].endswith("It has since stopped stepping: see the hung finding.")
    assert by_rule["straggler"]["message"].count("stopped stepping") == 1
    assert by_rule["straggler"]["evidence"]["hung"] is True

    ended = {"kind": "job_ended", "job": job_id, "ts": int(now * 1e6), "node": "n1", "state": "CANCELLED"}
    assert post(client, gz([ended])).status_code == 200
    health.evaluate_once(conn, now + 1)
    assert open_findings(conn, job_id) == []
    assert sorted(events[2:]) == [("hung_rank", "resolved"), ("straggler", "resolved")]
