"""The tables and downloads that printed figures their own way now go through the one formatter
(:mod:`jobsight.rules.display_text`): the job page's energy per epoch (table and chart tooltip) reads as
the metrics above it, the audit's energy columns have the digits of its metrics, the audit's CSV
downloads are clean exports (worded headers, empty unknowns, ISO days and UTC times, Slurm states,
numbers that parse back to the page's), and the Attention list words a job with no prolog as the jobs
list does.

On clusters of their own in the real database, through Streamlit's AppTest. A download's bytes live in
the run's media storage, which AppTest drops after each run: the ``downloads`` fixture keeps the real
storage (a subclass that remembers each instance) so a test can read what the button would send.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb
from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage
from streamlit.testing.v1 import AppTest, app_test

from jobsight.dashboard.views import job_epochs
from jobsight.rules import display_text, links
from tests.dashboard.seed import Seed

UTC = dt.UTC
J_PER_KWH = 3.6e6
ENERGY = 2.33605  # kWh: five significant digits read 2.3361; the audit's old "%.3f" read 2.336
NAME = '=HYPERLINK("http://example.invalid","x")'  # a job's name is its owner's: a formula to a spreadsheet


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def _figure(cell: str) -> float:
    return float(cell.removeprefix(display_text.GROWING))


def _config(element: Any) -> dict[str, Any]:
    return dict(json.loads(element.proto.columns or "{}"))


def _headers(element: Any) -> list[str]:
    config = _config(element)
    return [str((config.get(str(name)) or {}).get("label") or name) for name in element.value.columns]


# -- the job page's energy per epoch ---------------------------------------------------------------------


def test_the_epoch_tables_energy_reads_as_the_metrics_above_it(app_as: Callable[..., AppTest], dashboard_env: Seed,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBSIGHT_CARBON_INTENSITY_G_PER_KWH", "250")
    monkeypatch.setenv("JOBSIGHT_CARBON_PUE", "1.5")
    at = app_as("alice", "views/job.py", cluster=dashboard_env.cluster, job=dashboard_env.running, details="energy")
    _ok(at)
    metrics = {m.label: m.value for m in at.metric}
    kg_per_kwh = 1.5 * 250 / 1000
    table = next(d for d in at.dataframe if "J/sample" in d.value.columns)
    frame = table.value
    growing = [False, False, True]  # the running job's last epoch
    for kwh_column in ("GPU kWh", "total kWh"):  # no node power source: the total is the GPUs'
        # The call the metrics above make for the whole job, on each epoch's joules.
        assert list(frame[kwh_column]) == [display_text.energy(j / J_PER_KWH, growing=g, unit=False)
                                           for j, g in zip(frame["J"], growing, strict=True)]
    assert list(frame["kg CO2e"]) == [display_text.co2e(j / J_PER_KWH * kg_per_kwh, growing=g, unit=False)
                                      for j, g in zip(frame["J"], growing, strict=True)]
    assert list(frame["node kWh"]) == [display_text.MISSING] * 3 == [metrics["Rest of the nodes (kWh)"]] * 3
    # The running epoch is marked as the running job's metrics are, and only it.
    assert [c.startswith(display_text.GROWING) for c in frame["GPU kWh"]] == growing
    assert metrics["GPUs (kWh)"].startswith(display_text.GROWING)
    # The same digits as the metrics: five significant, whatever the size.
    assert all(len(re.sub(r"\D", "", c).lstrip("0")) == 5 for c in frame["GPU kWh"])
    # Each epoch's figure is the same energy in both units, to the digits shown.
    assert [_figure(c) for c in frame["GPU kWh"]] == pytest.approx(list(frame["J"] / J_PER_KWH), rel=1e-4)
    config = _config(table)
    assert all(config[c]["type_config"]["type"] == "text" for c in ("GPU kWh", "node kWh", "total kWh", "kg CO2e"))


def test_the_epoch_charts_tooltip_says_the_tables_figure() -> None:
    start = dt.datetime(2024, 3, 4, 10, tzinfo=UTC)
    rows = [{"epoch": e, "start": start + dt.timedelta(minutes=10 * e),
             "end": start + dt.timedelta(minutes=10 * e + 10), "energy_kwh": kwh, "j_per_sample": 1.0,
             "samples_per_s": 10.0, "method": "counter", "growing": grows}
            for e, kwh, grows in ((0, ENERGY, False), (1, 0.0123456, True))]
    spec = job_epochs.epoch_chart(job_epochs._frame(rows)).to_dict()
    tooltip = next(t for t in spec["encoding"]["tooltip"] if t.get("title") == "kWh")
    assert tooltip["field"] == "kwh" and "format" not in tooltip  # text, not a d3 format of its own
    values = next(iter(spec["datasets"].values()))
    assert [v["kwh"] for v in values] == ["2.3361", "≥ 0.012346"] == [
        display_text.energy(ENERGY, unit=False), display_text.energy(0.0123456, growing=True, unit=False)]


# -- the audit: its energy columns and its CSV downloads ---------------------------------------------------


@dataclass(frozen=True)
class Unnamed:
    cluster: str
    job: str  # a Slurm job no prolog was heard from: no user, account or partition; TIMEOUT; idle GPUs
    start: dt.datetime
    end: dt.datetime


@pytest.fixture
def unnamed(dashboard_env: Seed, database_url: str, monkeypatch: pytest.MonkeyPatch) -> Unnamed:
    cluster = f"csv-{uuid.uuid4().hex[:8]}"
    start = dt.datetime.combine(dt.datetime.now(UTC).date() - dt.timedelta(days=2), dt.time(10, 0, 5), UTC)
    end = start + dt.timedelta(hours=2)
    u = Unnamed(cluster, "8001", start, end)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO jobs (cluster, job_id, name, nodes, node_count, gpus, start_time, end_time, state, exit_code,
                                 last_seen)
               VALUES (%s, %s, %s, '{n1}', 1, '{n1:0,n1:1}', %s, %s, 'timeout', 0, %s)""",
            (cluster, u.job, NAME, start, end, end))
        conn.execute(
            """INSERT INTO job_summaries (cluster, job_id, gpu_count, gpu_hours, mean_util, energy_kwh, flags, summary)
               VALUES (%s, %s, 2, 4.0, 1.0, %s, '{idle_gpu}', %s)""",
            (cluster, u.job, ENERGY, Jsonb({})))
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_CLUSTER", cluster)
    return u


@pytest.fixture
def downloads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[MemoryMediaFileStorage]]:
    """Each run's media storage (Streamlit's own), kept after AppTest lets go of it."""
    kept: list[MemoryMediaFileStorage] = []

    class Kept(MemoryMediaFileStorage):
        def __init__(self, media_endpoint: str) -> None:
            super().__init__(media_endpoint)
            kept.append(self)

    monkeypatch.setattr(app_test, "MemoryMediaFileStorage", Kept)
    yield kept


def _download(at: AppTest, kept: list[MemoryMediaFileStorage], key: str) -> str:
    url = at.download_button(key=key).proto.url
    assert url, key
    return kept[-1].get_file(url.rsplit("/", 1)[-1]).content.decode()


def _rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def _audit(app_as: Callable[..., AppTest], u: Unnamed) -> AppTest:
    at = app_as("root", "views/audit.py", **links.audit_query(u.start.date(), u.start.date()))
    _ok(at)
    return at


def test_the_audits_energy_columns_have_the_digits_of_its_metrics(app_as: Callable[..., AppTest],
                                                                   unnamed: Unnamed) -> None:
    at = _audit(app_as, unnamed)
    by_user = at.dataframe[0]
    fmt = _config(by_user)["energy_kwh"]["type_config"]["format"]
    value = by_user.value["energy_kwh"].iloc[0]
    # One user: the column's figure is the metric's, and the report's (display_text), not "2.336".
    assert fmt % value == {m.label: m.value for m in at.metric}["Energy (kWh)"] == "2.3361"


def test_the_audits_csv_is_a_clean_export_that_parses_back(app_as: Callable[..., AppTest], unnamed: Unnamed,
                                                           downloads: list[MemoryMediaFileStorage]) -> None:
    at = _audit(app_as, unnamed)
    files = {key: _download(at, downloads, f"csv_{key}") for key in ("by-user", "by-account", "idle", "daily-trend")}
    for key, text in files.items():
        for word in ("None", "nan", "NaN", "NaT", "unknown", "+00:00"):
            assert re.search(rf"\b{re.escape(word)}", text) is None, (key, word, text)
        header = next(csv.reader(io.StringIO(text)))
        assert not [h for h in header if display_text.SNAKE_CASE.search(h)], (key, header)

    # By user: the table's own headers; the job no prolog named has an empty user, and its numbers are
    # the table's, to the last bit.
    table = at.dataframe[0]
    header = next(csv.reader(io.StringIO(files["by-user"])))
    assert {"user", "GPU-hours", "GPU kWh", "kg CO2e"} <= set(header) <= set(_headers(table))
    [row] = _rows(files["by-user"])
    assert row["user"] == "" and set(table.value["user"]) == {display_text.UNKNOWN}
    assert float(row["GPU-hours"]) == table.value["gpu_hours"].iloc[0] == pytest.approx(4.0)
    assert float(row["GPU kWh"]) == table.value["energy_kwh"].iloc[0] == pytest.approx(ENERGY)
    assert int(row["jobs"]) == 1
    assert _rows(files["by-account"])[0]["account"] == ""

    # The idle job: times in ISO 8601 UTC with Z, its state as Slurm names it, its name never a formula.
    [idle] = _rows(files["idle"])
    assert idle["job"] == unnamed.job and idle["state"] == "TIMEOUT"
    assert idle["started (UTC)"] == f"{unnamed.start:%Y-%m-%dT%H:%M:%S}Z"
    assert idle["ended (UTC)"] == f"{unnamed.end:%Y-%m-%dT%H:%M:%S}Z"
    assert dt.datetime.fromisoformat(idle["started (UTC)"]) == unnamed.start
    assert idle["name"] == "'" + NAME and idle["flags"] == "idle_gpu"
    assert idle["user"] == idle["account"] == idle["partition"] == ""

    # The trend: each day as an ISO date.
    [day] = _rows(files["daily-trend"])
    assert day["day (UTC)"] == unnamed.start.date().isoformat()
    assert float(day["GPU-hours"]) == pytest.approx(4.0)


# -- the Attention list ------------------------------------------------------------------------------------


def test_attention_words_a_job_no_prolog_named_as_the_jobs_list_does(app_as: Callable[..., AppTest],
                                                                      unnamed: Unnamed, database_url: str) -> None:
    now = dt.datetime.now(UTC)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO findings (cluster, job_id, rule, subject, node, severity, state, opened_at, updated_at,
                                     title, message, evidence)
               VALUES (%s, %s, 'idle_allocation', '', 'n1', 'warning', 'open', %s, %s, 'idle', 'idle', %s)""",
            (unnamed.cluster, unnamed.job, now, now, Jsonb({})))
        conn.execute(
            """INSERT INTO jobs (cluster, job_id, name, start_time, state, last_seen, attrs)
               VALUES (%s, 'local-run', 'cpu-run', %s, 'running', %s, %s)""",
            (unnamed.cluster, now, now, Jsonb({"process": {"user": "carol", "slurm": False}})))
        conn.execute(
            """INSERT INTO findings (cluster, job_id, rule, subject, node, severity, state, opened_at, updated_at,
                                     title, message, evidence)
               VALUES (%s, 'local-run', 'idle_allocation', '', 'n1', 'warning', 'open', %s, %s, 'idle', 'idle', %s)""",
            (unnamed.cluster, now, now, Jsonb({})))
    at = app_as("root", "views/attention.py")
    _ok(at)
    rows = at.dataframe[0].value.set_index("job")
    assert tuple(rows.loc[unnamed.job, ["user", "account", "partition"]]) == (display_text.UNKNOWN,) * 3
    assert tuple(rows.loc["local-run", ["account", "partition"]]) == (display_text.NOT_APPLICABLE,) * 2
    # A run outside Slurm is its process's owner, as in the jobs list (not "unknown").
    assert rows.loc["local-run", "user"] == "carol"
    jobs = app_as("root")
    _ok(jobs)
    jobs.selectbox(key="jobs_range").set_value("all time").run()
    assert jobs.dataframe[0].value.set_index("job").loc["local-run", "user"] == "carol"
    assert not rows[["user", "account", "partition"]].isna().any().any()
