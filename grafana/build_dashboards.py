"""Builds the Grafana dashboards in grafana/dashboards/ (provisioning JSON) from the panels below.

Run ``python grafana/build_dashboards.py`` after changing a panel; tests/prometheus/test_dashboards.py
checks that the checked-in JSON is what this writes, and runs every panel's query against a real
Prometheus that scraped a real collector. Panels use two variables, ``$cluster`` and ``$job``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
JOB = 'cluster="$cluster", job="$job"'
CLUSTER = 'cluster="$cluster"'


def _panel(number: int, title: str, unit: str, *queries: tuple[str, str], kind: str = "timeseries") -> dict[str, Any]:
    width = 12
    return {
        "id": number, "type": kind, "title": title, "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": width, "x": (number - 1) % 2 * width, "y": (number - 1) // 2 * 8},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [{"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
                    for i, (expr, legend) in enumerate(queries)],
    }


def _variable(name: str, query: str) -> dict[str, Any]:
    return {"name": name, "type": "query", "datasource": DATASOURCE, "refresh": 2,
            "query": {"query": query, "refId": name}, "definition": query}


def _dashboard(uid: str, title: str, panels: list[dict[str, Any]], variables: list[dict[str, Any]]) -> dict[str, Any]:
    datasource = {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"}
    return {
        "uid": uid, "title": title, "tags": ["jobsight"], "schemaVersion": 39, "version": 1, "editable": True,
        "time": {"from": "now-6h", "to": "now"}, "refresh": "1m",
        "templating": {"list": [datasource, *variables]}, "panels": panels,
    }


def job_view() -> dict[str, Any]:
    panels = [
        _panel(1, "GPU utilisation", "percentunit",
               (f"jobsight_job_gpu_utilization_ratio{{{JOB}}}", "{{node}} GPU {{gpu}}")),
        _panel(2, "GPU memory used", "bytes", (f"jobsight_job_gpu_memory_used_bytes{{{JOB}}}", "{{node}} GPU {{gpu}}")),
        _panel(3, "GPU power", "watt", (f"jobsight_job_gpu_power_watts{{{JOB}}}", "{{node}} GPU {{gpu}}")),
        _panel(4, "SM clock", "hertz", (f"jobsight_job_gpu_sm_clock_hertz{{{JOB}}}", "{{node}} GPU {{gpu}}")),
        _panel(5, "Throttle reasons active", "none",
               (f"sum by (node, gpu, reason) (jobsight_job_gpu_throttle_reason{{{JOB}}})",
                "{{node}} GPU {{gpu}} {{reason}}")),
        _panel(6, "Step time by rank", "s", (f"jobsight_job_step_duration_seconds{{{JOB}}}", "rank {{rank}}")),
        _panel(7, "Data-wait share by rank", "percentunit",
               (f"jobsight_job_step_data_wait_ratio{{{JOB}}}", "rank {{rank}}")),
        _panel(8, "Open findings", "none",
               (f"sum by (rule, severity) (jobsight_job_open_findings{{{JOB}}})", "{{rule}} ({{severity}})")),
        _panel(9, "Energy so far", "joule",
               (f"jobsight_job_gpu_energy_joules_total{{{JOB}}}", "GPUs"),
               (f"jobsight_job_node_energy_joules_total{{{JOB}}}", "node share")),
        _panel(10, "Emissions so far (CO2e)", "massg", (f"jobsight_job_emissions_grams_total{{{JOB}}}", "CO2e")),
    ]
    variables = [_variable("cluster", "label_values(jobsight_job_info, cluster)"),
                 _variable("job", f"label_values(jobsight_job_info{{{CLUSTER}}}, job)")]
    return _dashboard("jobsight-job", "jobsight: job", panels, variables)


def cluster_view() -> dict[str, Any]:
    util = f"jobsight_job_gpu_utilization_ratio{{{CLUSTER}}}"
    panels = [
        _panel(1, "GPU utilisation by partition", "percentunit", (f"avg by (partition) ({util})", "{{partition}}")),
        _panel(2, "GPU utilisation by account", "percentunit", (f"avg by (account) ({util})", "{{account}}")),
        _panel(3, "Idle allocated GPUs by partition (under 5 %)", "none",
               (f"count by (partition) ({util} < 0.05)", "{{partition}}")),
        _panel(4, "Jobs with idle GPUs", "none", (f"count by (job, user, partition) ({util} < 0.05)",
                                                  "{{job}} ({{user}})"), kind="table"),
        _panel(5, "Open findings", "none",
               (f"sum by (rule, severity) (jobsight_job_open_findings{{{CLUSTER}}})", "{{rule}} ({{severity}})")),
        _panel(6, "Running jobs by partition", "none",
               (f"count by (partition) (jobsight_job_info{{{CLUSTER}}})", "{{partition}}")),
        _panel(7, "GPU power by partition", "watt",
               (f"sum by (partition) (jobsight_job_gpu_power_watts{{{CLUSTER}}})", "{{partition}}")),
        _panel(8, "Series left out by the cap", "none", ("jobsight_exposition_series_left_out_total", "left out")),
    ]
    return _dashboard("jobsight-cluster", "jobsight: cluster", panels,
                      [_variable("cluster", "label_values(jobsight_job_info, cluster)")])


DASHBOARDS = {"jobsight-job.json": job_view, "jobsight-cluster.json": cluster_view}


def rendered() -> dict[str, str]:
    """Each dashboard file's name and text, as this module writes them."""
    return {name: json.dumps(build(), indent=2, sort_keys=True) + "\n" for name, build in DASHBOARDS.items()}


if __name__ == "__main__":
    HERE.mkdir(exist_ok=True)
    for name, text in rendered().items():
        (HERE / name).write_text(text)
