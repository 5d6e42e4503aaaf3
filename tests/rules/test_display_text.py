"""The one formatter (jobsight/rules/display_text.py): a table of inputs and the text each reads as, and
the report's lines built on it, so the dashboard (which calls the formatter) and the report (whose
lines are checked here) print the same text for the same value."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pandas as pd
import pytest

from jobsight.rules import display_text as d
from jobsight.rules.report_text import all_clear, format_report

SLURM_JOB = {"job_id": "42", "user_name": "alice", "account": "ml", "partition": "gpu", "state": "completed",
             "exit_code": 0, "start_time": "2024-03-04T10:00:00+00:00", "end_time": "2024-03-04T12:00:00+00:00"}
LOCAL_RUN = {"job_id": "local-ab12", "user_name": None, "account": None, "partition": None, "state": "running",
             "attrs": {"process": {"user": "root", "slurm": False}}}
NO_PROLOG = {"job_id": "43", "user_name": None, "state": "failed", "exit_code": 3}


@pytest.mark.parametrize(("value", "text"), [
    (None, "-"), (math.nan, "-"), (pd.NaT, "-"), (pd.NA, "-"), ("", "-"), (0, "0"), ("x", "x")])
def test_an_absent_value_reads_as_the_one_mark(value: Any, text: str) -> None:
    assert d.text(value) == text


@pytest.mark.parametrize(("job", "user", "account", "partition"), [
    (SLURM_JOB, "alice", "ml", "gpu"), (LOCAL_RUN, "root", "n/a", "n/a"), (NO_PROLOG, "unknown", "unknown", "unknown")])
def test_who_and_where(job: dict[str, Any], user: str, account: str, partition: str) -> None:
    assert (d.user(job), d.account(job), d.partition(job)) == (user, account, partition)


@pytest.mark.parametrize(("state", "code", "text"), [
    ("completed", 0, "COMPLETED"), ("completed", None, "COMPLETED"), ("failed", 3, "FAILED (exit code 3)"),
    ("timeout", 143, "TIMEOUT (signal 15)"), ("cancelled", 0, "CANCELLED"), ("running", None, "RUNNING"),
    (None, None, "unknown"), ("out_of_memory", math.nan, "OUT_OF_MEMORY")])
def test_a_state_reads_as_slurm_names_it(state: str | None, code: Any, text: str) -> None:
    assert d.state(state, code) == text


@pytest.mark.parametrize(("rank", "text"), [(None, "single process"), (-1, "single process"), (math.nan,
                                                                                                 "single process"),
                                            (0, "0"), (3.0, "3")])
def test_a_rank_reads_the_same_for_none_and_minus_one(rank: Any, text: str) -> None:
    assert d.rank(rank) == text


@pytest.mark.parametrize(("kwargs", "text"), [
    ({"kwh": 2.33605}, "2.3361 kWh"), ({"kwh": 2.336}, "2.3360 kWh"), ({"kwh": 0.29983, "growing": True},
                                                                        "≥ 0.29983 kWh"),
    ({"kwh": 2.33605, "method": "power"}, "≈ 2.34 kWh"), ({"kwh": 12345.67}, "12346 kWh"),
    ({"kwh": 123456.7}, "123456.7 kWh"), ({"kwh": 0.0}, "0 kWh"), ({"kwh": None}, "-"),
    ({"kwh": 1.5, "unit": False}, "1.5000")])
def test_energy_with_its_method_and_precision(kwargs: dict[str, Any], text: str) -> None:
    assert d.energy(**kwargs) == text


@pytest.mark.parametrize(("value", "text"), [
    (40 * 2**30, "40.0 GB"), (-2 * 2**20, "frees 2.0 MB"), (512, "512 B"), (None, "-")])
def test_memory_is_never_negative(value: Any, text: str) -> None:
    assert d.memory(value) == text


def test_times_read_as_the_pages_clock() -> None:
    moment = dt.datetime(2026, 11, 21, tzinfo=dt.UTC)
    assert d.day(pd.Timestamp(moment)) == d.day("2026-11-21 00:00:00+00:00") == "2026-11-21"
    assert d.moment("2026-11-21T01:02:03+01:00") == "2026-11-21 00:02:03 UTC"
    assert (d.duration(3723), d.duration(90061), d.duration(None)) == ("01:02:03", "1-01:01:01", "-")


@pytest.mark.parametrize(("name", "label"), [
    ("self_cpu_us", "self CPU (µs)"), ("job_id", "job"), ("user_name", "user"), ("calls_per_step", "calls per step"),
    ("wait_s", "wait (s)"), ("gpu_hours", "GPU-hours"), ("mean W", "mean W")])
def test_a_column_is_headed_in_words(name: str, label: str) -> None:
    assert d.column_label(name) == label and not d.SNAKE_CASE.search(label)


def test_the_report_prints_what_the_formatter_says() -> None:
    summary = {"gpu_hours": 4.0, "energy_kwh": 2.33605, "flags": ["idle_gpu"], "gpus": [{"node": "n1", "gpu_index": 0}]}
    text = format_report(LOCAL_RUN | {"start_time": "2024-03-04T10:00:00+00:00"}, {"final": False, "summary": summary})
    lines = {line.split(": ", 1)[0].strip(): line.split(": ", 1)[1] for line in text.splitlines() if ": " in line}
    assert lines["User/Account"] == f"{d.user(LOCAL_RUN)}/{d.account(LOCAL_RUN)}" == "root/n/a"
    assert lines["GPU-hours"] == d.gpu_hours(4.0, growing=True) == "≥ 4.00"
    assert lines["Energy"] == d.energy(2.33605, growing=True)
    assert lines["Start Time"] == d.moment("2024-03-04T10:00:00+00:00")
    assert "Request fewer GPUs (--gres=gpu:N)" in text


def test_no_problems_is_never_said_beside_an_open_finding() -> None:
    assert all_clear([]) == "No efficiency problems found."
    resolved = {"severity": "critical", "resolved_at": "2024-03-04T11:00:00+00:00"}
    assert all_clear([resolved]) == "No efficiency problems found."
    said = all_clear([resolved, {"severity": "critical"}, {"severity": "warning"}])
    assert "No efficiency problems" not in said and "2 finding(s) still open (critical, warning)" in said


@pytest.mark.parametrize(("keys", "label"), [
    (("ranks", "1", "silent_s"), "rank 1 › silent (s)"), (("gpu_power_recent_w",), "gpu power recent (W)"),
    (("cause", "sm_clock_mhz"), "cause › sm clock (MHz)"), (("cause", "temp_c"), "cause › temp (°C)"),
    (("step_s_by_rank", "3"), "step (s) by rank › 3"), (("xids",), "xids")])
def test_a_key_path_reads_in_words(keys: tuple[str, ...], label: str) -> None:
    assert d.key_path(keys) == label and not d.SNAKE_CASE.search(label)
