"""Server-side ``jobsight`` subcommands: ``up``, ``collector``, ``migrate``."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from agent.cli import CliError
from collector.settings import CollectorSettings, SettingsError, load_collector_settings

log = logging.getLogger("jobsight.up")

DASHBOARD_APP = Path(__file__).resolve().parent.parent / "dashboard" / "app.py"


def configure_parser(name: str, parser: argparse.ArgumentParser) -> None:
    if name == "up":
        parser.add_argument("--demo", action="store_true", help="also run a small demo training job")
        parser.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")
    elif name == "collector":
        parser.add_argument("--host", help="listen address (default: JOBSIGHT_HOST or 127.0.0.1)")
        parser.add_argument("--port", type=int, help="listen port (default: JOBSIGHT_PORT or 8787)")
        parser.add_argument("--workers", type=int, default=1, help="worker processes (one per core scales ingest)")
    elif name == "migrate":
        parser.add_argument("--check", action="store_true", help="exit 1 if the schema is not current")
        parser.add_argument("--downgrade", metavar="REVISION", help="downgrade to REVISION (e.g. base)")


def _settings() -> CollectorSettings:
    try:
        return load_collector_settings()
    except SettingsError as exc:
        raise CliError(str(exc)) from exc


def run(name: str, args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if name == "collector":
        return run_collector(_settings(), args)
    if name == "migrate":
        return run_migrate(_settings(), args)
    return run_up(_settings(), args)


def _database_url(settings: CollectorSettings) -> str:
    if not settings.database_url:
        raise CliError("JOBSIGHT_DATABASE_URL is not set")
    return settings.database_url


def run_migrate(settings: CollectorSettings, args: argparse.Namespace) -> int:
    from collector import migrate

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
    return 0


def run_collector(settings: CollectorSettings, args: argparse.Namespace) -> int:
    import uvicorn

    from collector.app import create_app

    if args.host:
        settings = settings.model_copy(update={"host": args.host})
    if args.port:
        settings = settings.model_copy(update={"port": args.port})
    _database_url(settings)
    if args.workers > 1:
        # Workers re-read settings from the environment; pass on what the flags changed.
        os.environ["JOBSIGHT_HOST"], os.environ["JOBSIGHT_PORT"] = settings.host, str(settings.port)
        uvicorn.run("collector.app:create_app", factory=True, host=settings.host, port=settings.port,
                    workers=args.workers, log_level="info", access_log=False)
        return 0
    try:
        app = create_app(settings)
    except (SettingsError, RuntimeError) as exc:
        raise CliError(str(exc)) from exc
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="info", access_log=False)
    return 0


class _Stack:
    """The processes `jobsight up` started, stopped in reverse order exactly once."""

    def __init__(self) -> None:
        self.children: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.database: object | None = None

    def spawn(self, label: str, argv: list[str], env: dict[str, str]) -> None:
        self.children.append((label, subprocess.Popen(argv, env=env, start_new_session=True)))

    def stop(self) -> None:
        for label, child in reversed(self.children):
            if child.poll() is None:
                child.terminate()
                try:
                    child.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    log.warning("%s did not stop in 15 s; killing it", label)
                    child.kill()
                    child.wait()
        self.children.clear()
        database, self.database = self.database, None
        if database is not None:
            database.stop()  # type: ignore[attr-defined]


def _wait_ready(label: str, url: str, child: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Wait until ``url`` answers 200, so the URLs we print work when the user clicks them."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise CliError(f"the {label} exited with code {child.returncode} during start-up", code=1)
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    raise CliError(f"the {label} at {url} was not ready after {timeout:.0f} s", code=1)


def run_up(settings: CollectorSettings, args: argparse.Namespace) -> int:
    from collector import migrate
    from collector.auth import ensure_admin_token
    from collector.embedded_db import EmbeddedDatabaseError, EmbeddedPostgres

    stack = _Stack()
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        database_url = settings.database_url
        if not database_url:
            database = EmbeddedPostgres(settings.data_dir / "postgres")
            stack.database = database
            try:
                database_url = database.start()
            except EmbeddedDatabaseError as exc:
                raise CliError(str(exc), code=1) from exc
        migrate.upgrade(database_url)
        ensure_admin_token(settings.resolved_admin_token_file())
        env = {**os.environ, "JOBSIGHT_DATABASE_URL": database_url, "JOBSIGHT_DATA_DIR": str(settings.data_dir)}
        collector_url = f"http://{settings.host}:{settings.port}"
        stack.spawn("collector", [sys.executable, "-m", "agent.cli", "collector"], env)
        _wait_ready("collector", f"{collector_url}/readyz", stack.children[-1][1])
        dashboard_url = f"http://{settings.host}:{settings.dashboard_port}"
        if not args.no_dashboard:
            stack.spawn("dashboard", [
                sys.executable, "-m", "streamlit", "run", str(DASHBOARD_APP),
                "--server.address", settings.host, "--server.port", str(settings.dashboard_port),
                "--server.headless", "true", "--browser.gatherUsageStats", "false",
            ], env)
            _wait_ready("dashboard", f"{dashboard_url}/_stcore/health", stack.children[-1][1])
        if args.demo:
            stack.spawn("demo", [sys.executable, "-m", "agent.demo"], {**env, "JOBSIGHT_URL": collector_url})
        print(f"jobsight is up\n  collector: {collector_url}  (API docs: {collector_url}/docs)")
        if not args.no_dashboard:
            print(f"  dashboard: {dashboard_url}")
        print(f"  data:      {settings.data_dir}  (admin token: {settings.resolved_admin_token_file()})")
        print("Press Ctrl-C to stop.", flush=True)
        while not stopping:
            for label, child in stack.children:
                if label != "demo" and child.poll() is not None:
                    raise CliError(f"the {label} exited with code {child.returncode}", code=1)
            time.sleep(0.5)
        print("stopping jobsight ...", flush=True)
        return 0
    finally:
        stack.stop()
