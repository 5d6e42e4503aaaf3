"""The job page reads the same everywhere: one clock (24-hour, UTC, said on every time axis),
epoch markers that leave the steps readable, log lines with their process's rank, a CPU
profile that does not call host time idle, and who ran a job outside Slurm."""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Callable, Iterator
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from jobsight.agent.training.context import process_owner
from jobsight.dashboard import charts
from jobsight.protocol.wire import now_us
from tests.collector.helpers import gz, post
from tests.dashboard.conftest import job_sections, sections_texts
from tests.dashboard.header_facts import header_facts
from tests.dashboard.seed import Seed


def _time_axes(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every temporal x encoding of a (possibly layered) Vega-Lite spec."""
    x = spec.get("encoding", {}).get("x")
    if isinstance(x, dict) and x.get("type") == "temporal":
        yield x
    for layer in spec.get("layer", []):
        yield from _time_axes(layer)


def _charts(at: AppTest) -> list[dict[str, Any]]:
    return [json.loads(element.proto.spec) for element in at.get("vega_lite_chart")]


def test_every_time_axis_of_the_job_page_is_24_hour_utc(app_as: Callable[..., AppTest], dashboard_env: Seed) -> None:
    # All of the 30-minute run: the running job's default window, its last 15 minutes, labels seconds too.
    sections = job_sections(app_as, "alice", cluster=dashboard_env.cluster, job=dashboard_env.running, window="all")
    for at in sections.values():
        assert not at.exception, [e.value for e in at.exception]
    specs = [spec for at in sections.values() for spec in _charts(at)]
    titles = [json.dumps(spec.get("title")) for spec in specs]
    assert any("Throughput" in title for title in titles), titles  # the chart that read 06:35
    axes = [(title, x) for spec, title in zip(specs, titles, strict=True) for x in _time_axes(spec)]
    assert len({title for title, _ in axes}) >= 6  # heatmap, a node's GPU lines, steps, throughput, loss, lr
    for title, x in axes:
        assert x["scale"]["type"] == "utc", title
        assert x["axis"]["format"] == charts.TIME_FORMAT == "%H:%M", title
        assert x["title"] == "time (UTC)", title


def test_many_epochs_draw_a_dozen_markers_first_and_last_kept() -> None:
    starts = pd.date_range("2024-03-04 18:30", periods=88, freq="20s", tz="UTC")
    markers = pd.DataFrame({"kind": "epoch", "start": starts, "end": starts,
                            "label": [f"epoch {i}" for i in range(88)]})
    markers.loc[len(markers)] = ["log error", starts[3], starts[3], "loss spike"]
    domain = (starts[0].to_pydatetime(), starts[-1].to_pydatetime())
    layer = charts.marker_layer(markers, domain)
    assert layer is not None
    (drawn,) = layer.to_dict()["datasets"].values()
    epochs = [row["label"] for row in drawn if row["kind"] == "epoch"]
    assert len(epochs) == charts.MAX_EPOCH_RULES
    assert epochs[0] == "epoch 0" and epochs[-1] == "epoch 87"
    gaps = pd.Series([int(label.split()[1]) for label in epochs]).diff().dropna()
    assert gaps.min() >= 7 and gaps.max() <= 8  # evenly chosen
    assert [row["label"] for row in drawn if row["kind"] != "epoch"] == ["loss spike"]  # other markers all kept
    few = charts.thin_epochs(markers.iloc[:5])
    assert len(few) == 5  # a few epochs are all drawn


@pytest.fixture
def local_job(client: Any, job_id: str) -> str:
    """A CPU run outside Slurm as its agent reports it, through the real collector: the run's
    metadata, rank 0's steps and run event, a log line of the same process without a rank (the
    handler found no RANK), and a CPU profile."""
    local = f"local-{job_id}"
    ts, pid = now_us() - 60_000_000, 4242
    records: list[dict[str, Any]] = [
        {"kind": "job_started", "job": local, "ts": ts, "node": "laptop", "name": "cpu run",
         "attrs": {"process": process_owner(), "run": {"framework": "lightning"}}},
        {"kind": "log", "job": local, "ts": ts + 1, "node": "laptop", "rank": 0, "pid": pid, "level": "INFO",
         "logger": "jobsight.run", "message": "fit started on rank 0 of 1 (cpu)"},
        {"kind": "log", "job": local, "ts": ts + 2, "node": "laptop", "pid": pid, "level": "INFO",
         "logger": "train", "message": "epoch 0 batch 0 loss 1.0"},
    ]
    records += [{"kind": "step", "job": local, "ts": ts + 1_000_000 * (i + 1), "node": "laptop", "rank": 0, "pid": pid,
                 "step": i, "epoch": 0, "phase": "train", "duration_s": 0.025, "samples": 32} for i in range(20)]
    records.append({"kind": "profile", "job": local, "ts": ts + 21_000_000, "node": "laptop", "rank": 0, "pid": pid,
                    "profile_id": "cpu-1", "step_start": 2, "step_end": 4,
                    "summary": {"breakdown": {"basis": "host", "window_us": 75_000.0, "compute_us": 11_000.0,
                                              "communication_us": 0, "memcpy_us": 0, "data_loading_us": 0,
                                              "host_other_us": 64_000.0}}})
    assert post(client, gz(records)).status_code == 200
    return local


def test_a_local_job_page_names_its_user_its_ranks_and_its_cpu_time(
    app_as: Callable[..., AppTest], local_job: str
) -> None:
    sections = job_sections(app_as, "root", cluster="default", job=local_job)
    for at in sections.values():
        assert not at.exception, [e.value for e in at.exception]
        metrics = header_facts(at)
        assert metrics["User"] == pwd.getpwuid(os.getuid()).pw_name
        assert metrics["Partition"] == "n/a"
    logs = next(d.value for d in sections["logs"].dataframe if "message" in d.value.columns).set_index("message")
    assert logs.loc["epoch 0 batch 0 loss 1.0", "rank"] == "0"  # display_text.rank: one process reads as such
    breakdown = next(e.proto for e in sections["profiles"].get("vega_lite_chart")
                     if json.loads(e.proto.spec).get("title") == "Per-rank breakdown")
    shipped = [pa.ipc.open_stream(d.data.data).read_all() for d in breakdown.datasets]
    if breakdown.data.data:
        shipped.append(pa.ipc.open_stream(breakdown.data.data).read_all())
    categories = {c for table in shipped for c in table.column("category").to_pylist()}
    assert "other CPU (host) time" in categories and "GPU idle" not in categories
    assert "idle" not in sections_texts(sections).lower().replace("gpu idle", "")
