"""The running jobs' exposition, scraped by Debian's real Prometheus from a real collector fed through
its ingest API with node and job tokens (tests/prometheus/feed.py; the node daemon's own sending is
tested in tests/agent): series with their labels, values as the job's API answers them, an ended job's
series stale, the cap counted, ``promtool check metrics`` clean, a job's token refused."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobsight.protocol.tokens import mint_job_token, mint_node_token
from tests.collector.helpers import SECRET
from tests.conftest import REPO, LiveCollector
from tests.prometheus.conftest import live_collector
from tests.prometheus.feed import GIB, FedJob, end, feed
from tests.prometheus.servers import PROMTOOL, Server, binary, prometheus, query, wait_until

CONFIG = """
[health]
interval_s = 0.5
hung_min_s = 2
[carbon]
intensity_g_per_kwh = 400
pue = 1.5
[exposition]
energy_refresh_s = 0
max_series = {max_series}
"""


@dataclass
class Stack:
    collector: LiveCollector
    prometheus: Server
    running: FedJob
    ended: FedJob


def scrape(collector: LiveCollector, token: str | None) -> tuple[int, str]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(f"{collector.url}/metrics/jobs", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def api(collector: LiveCollector, path: str) -> Any:
    request = urllib.request.Request(f"{collector.url}{path}", headers={"Authorization": f"Bearer {collector.token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def stack(module_database: str, data_dir: Path, admin_token: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    binary("prometheus")
    folder = tmp_path_factory.mktemp("prom-stack")
    collector = live_collector(module_database, data_dir, admin_token, folder, CONFIG.format(max_series=100_000))
    collector.start()
    token_file = folder / "scrape_token"
    token_file.write_text(admin_token + "\n")
    server = prometheus(folder, f"127.0.0.1:{collector.port}", token_file)
    try:
        running, ended = FedJob(f"run-{uuid.uuid4().hex[:8]}"), FedJob(f"end-{uuid.uuid4().hex[:8]}", user="bob",
                                                                          account="chem", partition="big")
        feed(collector.url, running)
        feed(collector.url, ended)
        server.start()
        yield Stack(collector, server, running, ended)
    finally:
        server.stop()
        collector.kill()


def labels_of(series: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in series["metric"].items() if k not in ("__name__", "instance")}


def test_prometheus_scrapes_each_gpu_rank_finding_and_energy_as_the_api_says(stack: Stack) -> None:
    job = stack.running
    selector = f'{{job="{job.job_id}"}}'
    util = wait_until(lambda: query(stack.prometheus, f"jobsight_job_gpu_utilization_ratio{selector}"),
                      "the job's GPU series in Prometheus", log=stack.collector.log_path)
    info = api(stack.collector, f"/v1/jobs/{job.job_id}")
    assert len(util) == len(job.nodes) * job.gpus_per_node
    for series in util:
        labels = labels_of(series)
        assert {k: labels[k] for k in ("cluster", "job", "user", "account", "partition")} == {
            "cluster": "default", "job": job.job_id, "user": info["user_name"], "account": info["account"],
            "partition": info["partition"]}
        sent = job.latest[(labels["node"], int(labels["gpu"]))]
        assert float(series["value"][1]) == pytest.approx(sent["util_gpu"] / 100)
    for name, field, scale in (("jobsight_job_gpu_memory_used_bytes", "mem_used", 1),
                               ("jobsight_job_gpu_power_watts", "power_w", 1),
                               ("jobsight_job_gpu_sm_clock_hertz", "sm_clock_mhz", 1e6)):
        found = query(stack.prometheus, f"{name}{selector}")
        assert {(s["metric"]["node"], s["metric"]["gpu"]): float(s["value"][1]) for s in found} == {
            (node, str(gpu)): pytest.approx(sample[field] * scale) for (node, gpu), sample in job.latest.items()}
    throttled = query(stack.prometheus, f"jobsight_job_gpu_throttle_reason{selector}")
    assert {(s["metric"]["node"], s["metric"]["gpu"], s["metric"]["reason"]) for s in throttled} == {
        (node, "0", "sw_power_cap") for node in job.nodes}
    steps = query(stack.prometheus, f"jobsight_job_step_duration_seconds{selector}")
    assert {s["metric"]["rank"]: round(float(s["value"][1]), 6) for s in steps} == {
        str(rank): round(0.1 * (1 + rank), 6) for rank in range(job.ranks)}
    waits = query(stack.prometheus, f"jobsight_job_step_data_wait_ratio{selector}")
    assert sorted(round(float(s["value"][1]), 6) for s in waits) == [0.2] * job.ranks
    # The evaluator finds every rank silent past hung_min_s: the job's open findings as the API lists them.
    findings = wait_until(lambda: query(stack.prometheus, f"jobsight_job_open_findings{selector}"), "open findings")
    listed = [f for f in api(stack.collector, f"/v1/jobs/{job.job_id}/findings")["findings"] if f["state"] == "open"]
    assert {(s["metric"]["rule"], s["metric"]["severity"]): int(float(s["value"][1])) for s in findings} == {
        (f["rule"], f["severity"]): sum(1 for g in listed if (g["rule"], g["severity"]) == (f["rule"], f["severity"]))
        for f in listed}
    energy = api(stack.collector, f"/v1/jobs/{job.job_id}/summary")["energy"]
    gpu_j = float(query(stack.prometheus, f"jobsight_job_gpu_energy_joules_total{selector}")[0]["value"][1])
    node_j = float(query(stack.prometheus, f"jobsight_job_node_energy_joules_total{selector}")[0]["value"][1])
    grams = float(query(stack.prometheus, f"jobsight_job_emissions_grams_total{selector}")[0]["value"][1])
    assert gpu_j == pytest.approx(energy["gpu_kwh"] * 3.6e6)
    assert node_j == pytest.approx(energy["node_kwh"] * 3.6e6)
    assert grams == pytest.approx((gpu_j + node_j) / 3.6e6 * 400 * 1.5)
    assert job.latest[(job.nodes[0], 0)]["mem_used"] == 10 * GIB


def test_an_ended_jobs_series_go_stale(stack: Stack) -> None:
    selector = f'jobsight_job_info{{job="{stack.ended.job_id}"}}'
    wait_until(lambda: query(stack.prometheus, selector), "the job's series", log=stack.collector.log_path)
    end(stack.collector.url, stack.ended)
    wait_until(lambda: not query(stack.prometheus, selector), "the ended job's series going stale")
    wait_until(lambda: not query(stack.prometheus, f'{{job="{stack.ended.job_id}"}}'), "every series of it stale")
    assert query(stack.prometheus, f'jobsight_job_info{{job="{stack.running.job_id}"}}')


def test_promtool_checks_a_scrape_clean(stack: Stack, tmp_path: Path) -> None:
    status, text = scrape(stack.collector, stack.collector.token)
    assert status == 200 and "jobsight_job_gpu_power_watts{" in text
    checked = subprocess.run([binary(PROMTOOL), "check", "metrics"], input=text.encode(), capture_output=True,
                             timeout=60)
    assert checked.returncode == 0 and not checked.stdout.strip() and not checked.stderr.strip(), (
        checked.stdout.decode() + checked.stderr.decode())


def test_only_the_admin_token_reads_the_exposition(stack: Stack) -> None:
    job_token = mint_job_token(SECRET, "default", stack.running.job_id, 3600, uid=stack.running.uid)
    assert scrape(stack.collector, job_token)[0] == 403
    assert scrape(stack.collector, mint_node_token(SECRET, "default", "n1"))[0] == 403
    assert scrape(stack.collector, None)[0] == 401
    assert scrape(stack.collector, stack.collector.token)[0] == 200


def test_hostile_names_are_label_data_and_the_cap_counts_what_it_leaves_out(
    stack: Stack, module_database: str, data_dir: Path, admin_token: str, tmp_path: Path,
) -> None:
    # A second collector on the same database with a cap of 20 series: the fed 4-GPU jobs (about 40 series
    # each) cannot fit whole, so they are left out and counted; the 1-GPU job (about 15) fits.
    hostile = FedJob(f"evil-{uuid.uuid4().hex[:6]}", nodes=("n9",), gpus_per_node=1, ranks=1,
                     user='mallory"} x{a="', name='bad"} injected{job="other"}\n# TYPE x counter\\')
    feed(stack.collector.url, hostile)
    capped = live_collector(module_database, data_dir, admin_token, tmp_path, CONFIG.format(max_series=20))
    capped.start()
    try:
        first = scrape(capped, admin_token)[1]
        second = scrape(capped, admin_token)[1]
    finally:
        capped.kill()
    status, text = scrape(stack.collector, admin_token)
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(text)}
    info = [s for s in families["jobsight_job_info"].samples if s.labels["job"] == hostile.job_id]
    assert [(s.labels["user"], s.labels["name"]) for s in info] == [(hostile.user, hostile.name)]
    assert not [line for line in text.splitlines() if line.startswith("# TYPE x")]
    left = {f.name: f.samples[0].value for f in text_string_to_metric_families(first)
            if f.name.startswith("jobsight_exposition")}
    running = int({f.name: f.samples[0].value for f in text_string_to_metric_families(text)
                   if f.name == "jobsight_exposition_jobs"}["jobsight_exposition_jobs"])
    assert left["jobsight_exposition_jobs"] + left["jobsight_exposition_jobs_left_out"] == running
    assert left["jobsight_exposition_jobs_left_out"] >= 1
    kept = [s for f in text_string_to_metric_families(first) if f.name.startswith("jobsight_job_") for s in f.samples]
    assert 0 < len(kept) <= 20
    per_scrape = [next(s.value for f in text_string_to_metric_families(t)
                       if f.name == "jobsight_exposition_series_left_out" for s in f.samples) for t in (first, second)]
    assert per_scrape[0] > 0 and per_scrape[1] == 2 * per_scrape[0]


def panel_queries() -> list[tuple[str, str, str]]:
    """Every (dashboard, panel, PromQL) of the checked-in dashboards."""
    found = []
    for path in sorted((REPO / "grafana" / "dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            found += [(path.name, panel["title"], target["expr"]) for target in panel["targets"]]
    return found


def test_the_checked_in_dashboards_are_what_the_builder_writes() -> None:
    spec = importlib.util.spec_from_file_location("build_dashboards", REPO / "grafana" / "build_dashboards.py")
    assert spec is not None and spec.loader is not None
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    checked_in = {path.name: path.read_text() for path in (REPO / "grafana" / "dashboards").glob("*.json")}
    assert checked_in == builder.rendered()
    assert len(panel_queries()) >= 18


def test_every_dashboard_panel_query_returns_data_for_the_job(stack: Stack) -> None:
    job = stack.running
    wait_until(lambda: query(stack.prometheus, f'jobsight_job_open_findings{{job="{job.job_id}"}}'), "findings")
    empty = []
    for dashboard, title, expr in panel_queries():
        promql = expr.replace("$cluster", "default").replace("$job", job.job_id)
        if not wait_until(lambda promql=promql: query(stack.prometheus, promql), f"{dashboard} {title}: {promql}",
                          timeout=20):
            empty.append((dashboard, title))
    assert not empty
