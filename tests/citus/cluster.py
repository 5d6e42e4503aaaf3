"""A real Citus cluster for tests: a coordinator and two workers, each Debian's PostgreSQL 15 with
``shared_preload_libraries = 'citus'`` (built by tests/citus/build_citus.sh), on loopback ports;
and a plain PostgreSQL 15 server, the single-server answer the cluster's is compared with.

As root the servers run as a system user (collector/store/embedded_db.py). Host logins need a password
(scram-sha-256); the nodes share one, and each server's own ``pgpass`` lets the coordinator reach its
workers as ``postgres``.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from jobsight.collector.store.embedded_db import EmbeddedPostgres

PG15_BIN = Path("/usr/lib/postgresql/15/bin")
REQUIRE_ENV = "JOBSIGHT_REQUIRE_CITUS"
# Enough connections for the collector's pool and Citus's own (coordinator → workers, per shard).
# sslmode=disable: the servers run as a system user with root's HOME, whose ~/.postgresql libpq would try.
SERVER_SETTINGS = ("max_connections=300", "citus.max_cached_conns_per_worker=2", "citus.node_conninfo=sslmode=disable")


def citus_missing() -> str | None:
    """Why the Citus tests cannot run here, or ``None`` when they can."""
    pg_config = PG15_BIN / "pg_config"
    if not (PG15_BIN / "postgres").exists() or not pg_config.exists():
        return ("Debian's PostgreSQL 15 server and headers are not installed (apt-get install postgresql-15 "
                "postgresql-server-dev-15; tests/citus/build_citus.sh does both)")
    libdir = subprocess.run([str(pg_config), "--pkglibdir"], capture_output=True, text=True, check=True).stdout.strip()
    if not (Path(libdir) / "citus.so").exists():
        return f"Citus is not installed in {libdir} (tests/citus/build_citus.sh <citus-13.0.5.tar.gz> builds it)"
    return None


def required() -> bool:
    """CI sets ``JOBSIGHT_REQUIRE_CITUS=1``: there a missing Citus fails the tests instead of skipping."""
    return os.environ.get(REQUIRE_ENV) == "1"


def skip_or_fail_without_citus() -> None:
    """Skip the calling test where Citus is not installed, or fail it where CI requires Citus."""
    why = citus_missing()
    if why is not None:
        if required():
            pytest.fail(f"JOBSIGHT_REQUIRE_CITUS=1 but {why}")
        pytest.skip(why)


@dataclass
class CitusCluster:
    coordinator: EmbeddedPostgres
    workers: list[EmbeddedPostgres] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.coordinator.url

    def destroy(self) -> None:
        for server in [self.coordinator, *self.workers]:
            server.destroy()


def _server(data_dir: Path, citus: bool, password: str | None = None) -> EmbeddedPostgres:
    settings = (*SERVER_SETTINGS, "shared_preload_libraries=citus") if citus else ("max_connections=300",)
    server = EmbeddedPostgres(data_dir, bin_dir=PG15_BIN, server_settings=settings, password=password)
    server.start()
    return server


def start_single_server(base: Path) -> EmbeddedPostgres:
    """A plain PostgreSQL 15 (no Citus), for the single-server answers."""
    return _server(base / "single", citus=False)


def start_citus_cluster(base: Path, workers: int = 2) -> CitusCluster:
    """Coordinator and ``workers`` workers, each with the ``citus`` extension in the ``jobsight``
    database, the workers added to the coordinator."""
    # One password for every node: each server logs in to the others with its own pgpass.
    password = secrets.token_urlsafe(32)
    cluster = CitusCluster(_server(base / "coordinator", citus=True, password=password))
    try:
        cluster.workers = [_server(base / f"worker{i}", citus=True, password=password) for i in range(workers)]
        for server in cluster.workers:
            with psycopg.connect(server.url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS citus")
        with psycopg.connect(cluster.url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS citus")
            conn.execute("SELECT citus_set_coordinator_host(%s, %s)", (cluster.coordinator.host,
                                                                       cluster.coordinator.port))
            for server in cluster.workers:
                conn.execute("SELECT citus_add_node(%s, %s)", (server.host, server.port))
    except BaseException:
        cluster.destroy()
        raise
    return cluster
