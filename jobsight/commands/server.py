"""``jobsight collector`` and ``jobsight migrate``: the collector and its schema, against ``JOBSIGHT_DATABASE_URL``."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

from jobsight.collector.api.telemetry import MULTIPROC_DIR_ENV, clear_multiprocess_dir
from jobsight.collector.config.settings import CollectorSettings, SettingsError, load_collector_settings
from jobsight.commands.cli_error import CliError


def configure_parser(name: str, parser: argparse.ArgumentParser) -> None:
    if name == "collector":
        parser.add_argument("--host", help="listen address (default: JOBSIGHT_HOST or 127.0.0.1)")
        parser.add_argument("--port", type=int, help="listen port (default: JOBSIGHT_PORT or 8787)")
        parser.add_argument("--workers", type=int, default=1,
                            help="worker processes (one per core scales ingest); /metrics sums them all")
    elif name == "migrate":
        parser.add_argument("--check", action="store_true", help="exit 1 if the schema is not current")
        parser.add_argument("--downgrade", metavar="REVISION", help="downgrade to REVISION (e.g. base)")
        parser.add_argument("--citus", action="store_true",
                            help="then distribute the schema on the Citus coordinator JOBSIGHT_DATABASE_URL "
                                 "names (idempotent; docs/scale.md)")


def load_settings() -> CollectorSettings:
    """The collector's settings; a bad value is a :class:`CliError` naming it."""
    try:
        return load_collector_settings()
    except SettingsError as exc:
        raise CliError(str(exc)) from exc


def run(name: str, args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if name == "collector":
        return run_collector(load_settings(), args)
    return run_migrate(load_settings(), args)


def _database_url(settings: CollectorSettings) -> str:
    if not settings.database_url:
        raise CliError("JOBSIGHT_DATABASE_URL is not set")
    return settings.database_url


def run_migrate(settings: CollectorSettings, args: argparse.Namespace) -> int:
    from jobsight.collector.store import migrate

    url = _database_url(settings)
    try:
        if args.check:
            current, head = migrate.current_revision(url), migrate.head_revision()
            print(f"database at {current}, code at {head}")
            return 0 if current == head else 1
        if args.downgrade:
            migrate.downgrade(url, args.downgrade)
        else:
            migrate.upgrade(url)
    except Exception as exc:  # boundary: any migration failure becomes one line for the admin
        raise CliError(f"migration failed: {str(exc).splitlines()[0]}", code=1) from exc
    if getattr(args, "citus", False) and not args.downgrade:
        return _distribute(url)
    return 0


def _distribute(url: str) -> int:
    from jobsight.collector.store.citus import CitusError, distribute

    try:
        placement = distribute(url)
    except CitusError as exc:
        raise CliError(f"citus: {exc}", code=1) from exc
    except Exception as exc:  # boundary: a refusal of Citus's becomes one line for the admin
        raise CliError(f"citus: distributing the schema failed: {str(exc).splitlines()[0]}", code=1) from exc
    print(f"citus: {len(placement.distributed)} distributed tables, {len(placement.reference)} reference, "
          f"{len(placement.local)} local ({', '.join(placement.local)}); placed now: "
          f"{', '.join(placement.placed_now) or 'none (already distributed)'}")
    return 0


@contextmanager
def shared_metrics_dir() -> Iterator[str]:
    """The directory where every worker keeps its metrics for ``/metrics`` to add up
    (prometheus_client's multiprocess mode), exported as ``PROMETHEUS_MULTIPROC_DIR``.

    An administrator's ``PROMETHEUS_MULTIPROC_DIR`` is used as it is; otherwise a fresh
    temporary directory is made, and removed when the collector stops. Either way it holds
    no value files of an earlier run when the workers start: their counts would be added in.
    """
    given = os.environ.get(MULTIPROC_DIR_ENV)
    if given:
        try:
            os.makedirs(given, exist_ok=True)
            clear_multiprocess_dir(given)
        except OSError as exc:
            raise CliError(f"{MULTIPROC_DIR_ENV}={given}: {exc}") from exc
        yield given
        return
    path = tempfile.mkdtemp(prefix="jobsight-metrics-")
    # Set before uvicorn spawns the workers: each one imports prometheus_client afresh and
    # reads the variable then.
    os.environ[MULTIPROC_DIR_ENV] = path
    try:
        yield path
    finally:
        os.environ.pop(MULTIPROC_DIR_ENV, None)
        shutil.rmtree(path, ignore_errors=True)


def run_collector(settings: CollectorSettings, args: argparse.Namespace) -> int:
    import uvicorn

    if args.workers < 1:
        raise CliError(f"--workers: expected at least 1, got {args.workers}")
    if args.host:
        settings = settings.model_copy(update={"host": args.host})
    if args.port:
        settings = settings.model_copy(update={"port": args.port})
    _database_url(settings)
    if args.workers > 1:
        # Workers re-read settings from the environment; pass on what the flags changed.
        os.environ["JOBSIGHT_HOST"], os.environ["JOBSIGHT_PORT"] = settings.host, str(settings.port)
        with shared_metrics_dir():
            uvicorn.run("jobsight.collector.app:create_app", factory=True, host=settings.host, port=settings.port,
                        workers=args.workers, log_level="info", access_log=False,
                        timeout_keep_alive=settings.keep_alive_s)
        return 0
    from jobsight.collector.app import create_app

    # One process keeps its metrics in memory, unless an administrator's PROMETHEUS_MULTIPROC_DIR
    # put prometheus_client in multiprocess mode: then that directory is started clean as well.
    with shared_metrics_dir() if os.environ.get(MULTIPROC_DIR_ENV) else nullcontext():
        try:
            app = create_app(settings)
        except (SettingsError, RuntimeError) as exc:
            raise CliError(str(exc)) from exc
        uvicorn.run(app, host=settings.host, port=settings.port, log_level="info", access_log=False,
                    timeout_keep_alive=settings.keep_alive_s)
    return 0
