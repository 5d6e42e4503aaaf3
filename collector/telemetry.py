"""The collector's own Prometheus metrics (served at ``/metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class CollectorMetrics:
    """One registry per app, so several apps (tests) can live in one process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.records = Counter(
            "jobsight_records_ingested", "Records stored, by kind", ["kind"], registry=self.registry
        )
        self.batches = Counter(
            "jobsight_batches", "Batches received, by outcome (stored, duplicate)", ["outcome"], registry=self.registry
        )
        self.rejects = Counter(
            "jobsight_ingest_rejects", "Batches rejected, by reason", ["reason"], registry=self.registry
        )
        self.latency = Histogram(
            "jobsight_ingest_batch_seconds",
            "Time to validate and store one batch",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
