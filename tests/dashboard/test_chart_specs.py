"""Every chart the pages send is a valid Vega-Lite spec.

The pages send their charts without Altair's schema check (``jobsight/dashboard/vega.py``: it cost a
third of a big job page's server time on every load); this is where the check happens instead, on
what the browser is sent: each spec of every section of a 64-GPU job's page, of a job that has
profiles and epochs, and of the audit, checked against the Vega-Lite schema Altair carries.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import altair as alt
import pandas as pd
from altair.vegalite.v6.schema import core
from streamlit.testing.v1 import AppTest

from jobsight.dashboard import charts, vega
from tests.dashboard import drawn_heatmap
from tests.dashboard.conftest import job_sections
from tests.dashboard.seed import BigJob, Seed


def _sent(at: AppTest) -> list[dict[str, Any]]:
    return [json.loads(chart.proto.spec) for chart in at.get("vega_lite_chart")]


def _check(specs: list[dict[str, Any]]) -> None:
    for spec in specs:
        core.TopLevelSpec.validate(spec)  # raises, naming the property, on an invalid spec


def test_every_chart_of_a_big_jobs_page_is_a_valid_spec(app_as: Callable[..., AppTest], big_job: BigJob) -> None:
    sections = job_sections(app_as, "root", cluster=big_job.cluster, job=big_job.job_id)
    specs = [spec for at in sections.values() for spec in _sent(at)]
    # The heatmap, two nodes' GPU lines, the step band, throughput and the metrics at least.
    assert len(specs) >= 6
    _check(specs)
    # Every time in a tooltip is formatted by utcFormat, with no time unit: a time unit is computed for
    # every row as the chart is drawn and needs each row's time parsed into a date first, which the
    # time charts' data skip (vega.as_sent).
    times = [t for spec in specs for t in _tooltips(spec) if t.get("type") == "temporal"]
    assert len(times) >= 5 and all(t.get("formatType") == "utc" and "timeUnit" not in t for t in times), times
    parses = [d["format"]["parse"] for spec in specs for d in _data(spec) if "format" in d]
    assert len(parses) >= 5 and set(parses) == {None}


def _tooltips(node: Any) -> list[dict[str, Any]]:
    """Every tooltip field of a spec, at any depth."""
    if isinstance(node, list):
        return [t for child in node for t in _tooltips(child)]
    if not isinstance(node, dict):
        return []
    found = [t for t in node["tooltip"] if isinstance(t, dict)] if isinstance(node.get("tooltip"), list) else []
    return found + [t for key, child in node.items() if key != "tooltip" for t in _tooltips(child)]


def _data(node: Any) -> list[dict[str, Any]]:
    """Every layer's ``data`` of a spec, at any depth."""
    if isinstance(node, list):
        return [d for child in node for d in _data(child)]
    if not isinstance(node, dict):
        return []
    own = [node["data"]] if isinstance(node.get("data"), dict) else []
    return own + [d for key, child in node.items() if key not in ("data", "datasets") for d in _data(child)]


def test_every_chart_of_a_profiled_job_and_the_audit_is_a_valid_spec(app_as: Callable[..., AppTest],
                                                                     dashboard_env: Seed) -> None:
    sections = job_sections(app_as, "alice", cluster=dashboard_env.cluster, job=dashboard_env.running)
    specs = [spec for at in sections.values() for spec in _sent(at)]
    titles = json.dumps([spec.get("title") for spec in specs])
    assert "Energy per epoch" in titles and "Per-rank breakdown" in titles, titles
    _check(specs)
    audit = _sent(app_as("root", "views/audit.py"))
    assert audit
    _check(audit)


def test_what_vega_sends_is_what_altair_checks() -> None:
    """The unchecked spec is Altair's checked one, with the data by name beside it."""
    frame = pd.DataFrame({"day": pd.to_datetime(["2026-11-20", "2026-11-21"], utc=True),
                          "gpu_hours": [36.0, 16.0], "low_util_gpu_hours": [3.0, 0.5]})
    chart = charts.trend_chart(frame)
    # Streamlit's theme ("none") is what the page sends charts under, through vega.spec as through st.altair_chart.
    with alt.data_transformers.disable_max_rows(), alt.theme.enable("none"):
        checked = chart.to_dict()
    sent = vega.spec(chart)
    (name,) = sent["datasets"]
    (rows,) = checked.pop("datasets").values()
    data = sent.pop("datasets")[name]
    assert sent.pop("data") == {"name": name} and "name" in checked.pop("data")
    assert sent.pop("padding") == {"top": vega.TITLE_ROOM_PX}  # room above the title; Streamlit pads the bottom
    assert sent == checked
    assert len(data) == len(rows) == 4


def test_the_audit_trend_says_its_lines_in_words() -> None:
    frame = pd.DataFrame({"day": pd.to_datetime(["2026-11-20", "2026-11-21"], utc=True),
                          "gpu_hours": [36.0, 16.0], "low_util_gpu_hours": [3.0, 0.5]})
    sent = vega.spec(charts.trend_chart(frame))
    (data,) = sent["datasets"].values()
    assert set(data["series"]) == {"GPU-hours", "low-util GPU-hours"}
    assert set(data["date"]) == {"2026-11-20", "2026-11-21"}  # the tooltip's day, never a time of day
    tooltip = json.dumps(sent["encoding"]["tooltip"])
    assert "gpu_hours" not in tooltip and "timeUnit" not in tooltip
    # A tick a day at most, so no day is labelled twice.
    assert sent["encoding"]["x"]["axis"]["tickCount"] == {"interval": "day", "step": 1}  # UTC days: a utc scale
    core.TopLevelSpec.validate({key: value for key, value in sent.items() if key != "datasets"})


def test_the_heatmap_is_one_picture_with_a_tooltip_a_gpu() -> None:
    """The heatmap's cells are one picture, not a Vega item a cell (8,000 on a 64-GPU page): a row a
    GPU in number order (n01:2 before n01:10), a column a bucket, each cell in the legend's colour for
    its value. A row a GPU answers the pointer; its times go as sent (no ``toDate()`` a row) and its
    items have no ARIA description."""
    start = pd.Timestamp("2026-11-27T23:00:00Z")
    gpus = [f"n{node:02d}:{index}" for node in (1, 2) for index in range(12)]
    frame = pd.DataFrame([{"node": g.split(":")[0], "gpu": g, "bucket": start + pd.Timedelta(seconds=s),
                           "util_gpu": float(10 * s + i), "bucket_s": 1.0}
                          for i, g in enumerate(gpus) for s in range(3)])
    domain = (start.to_pydatetime(), (start + pd.Timedelta(seconds=3)).to_pydatetime())
    sent = vega.spec(charts.gpu_heatmap(frame, domain))
    _check([{**sent, "datasets": {}}])  # the frames go beside the spec, as Arrow (see vega.spec)
    picture, rows, legend = sent["layer"]
    assert picture["mark"]["type"] == "image" and picture["mark"]["aspect"] is False
    assert rows["encoding"]["y"]["scale"]["domain"] == gpus and "sort" not in rows["encoding"]["y"]
    assert legend["encoding"]["color"]["scale"] == {"domain": [0.0, 100.0], "scheme": "viridis"}
    for layer in sent["layer"]:
        assert layer["data"]["format"] == {"parse": None} and layer["mark"]["aria"] is False
    assert rows["mark"]["tooltip"] == {"expr": "datum.tip"} and rows["mark"]["opacity"] == 0
    drawn = drawn_heatmap.cells(sent["datasets"])
    assert len(drawn) == len(frame)
    expected = frame.assign(bucket=frame["bucket"].astype("datetime64[us, UTC]"))
    for cell in drawn.itertuples():
        (value,) = expected.loc[(expected["gpu"] == cell.gpu) & (expected["bucket"] == cell.bucket), "util_gpu"]
        assert cell.rgba == drawn_heatmap.colour(value) and cell.end - cell.bucket == pd.Timedelta(seconds=1)
    tips = next(d for d in sent["datasets"].values() if "tip" in d.columns)
    assert list(tips["gpu"]) == gpus
    assert tips["tip"].iloc[1] == "n01:1 · mean 11 % · lowest 1 % at 2026-11-27 23:00:00 UTC"
    # The other charts keep Vega-Lite's parse: their tooltips format times with a time unit.
    assert "format" not in vega.spec(charts.trend_chart(pd.DataFrame(
        {"day": pd.to_datetime(["2026-11-20"], utc=True), "gpu_hours": [1.0], "low_util_gpu_hours": [0.0]})))["data"]


def test_layers_are_altair_s_layer_chart_without_its_parameter_merge() -> None:
    """vega.Layers skips Altair's merge of parameters the dashboard's layers do not have: the spec is
    the same as Altair's LayerChart gives, sizes moved to the whole, the callers' charts untouched.
    (Each layer has its own data, as the dashboard's do: Altair would lift data the layers share.)"""
    line = alt.Chart(pd.DataFrame({"x": [1.0, 2.0], "y": [3.0, 4.0]})).mark_line().encode(
        x="x:Q", y="y:Q").properties(height=120)
    rule = alt.Chart(pd.DataFrame({"x": [1.5]})).mark_rule().encode(x="x:Q")
    inner = alt.LayerChart(layer=[line, rule])
    for layers, props in (([line, rule], {"title": "t"}), ([inner, rule], {"width": 300})):
        with alt.theme.enable("none"):
            ours = vega.Layers(layers, **props).to_dict()
            altairs = alt.LayerChart(layer=layers, **props).to_dict()
        assert ours == altairs
        core.TopLevelSpec.validate(ours)
    assert line.height == 120 and vega.Layers([line, rule]).to_dict()["height"] == 120
