"""``jobsight up``: embedded PostgreSQL (or ``JOBSIGHT_DATABASE_URL``), the collector and the
dashboard, and with ``--demo`` a small real training job: a whole install on one machine."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from types import FrameType

from jobsight.cli import CliError
from jobsight.collector.settings import CollectorSettings
from jobsight.commands.dashboard import streamlit_argv
from jobsight.commands.server import load_settings

log = logging.getLogger("jobsight.up")

def configure_parser(name: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--demo", action="store_true", help="also run a small demo training job")
    parser.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")


def run(name: str, args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return run_up(load_settings(), args)


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
    from jobsight.collector import migrate
    from jobsight.collector.auth import ensure_admin_token, ensure_cluster_secret
    from jobsight.collector.embedded_db import EmbeddedDatabaseError, EmbeddedPostgres

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
        # A trial install mints job and node tokens too, so it needs the secret they are signed with.
        ensure_cluster_secret(settings.resolved_secret_file())
        env = {**os.environ, "JOBSIGHT_DATABASE_URL": database_url, "JOBSIGHT_DATA_DIR": str(settings.data_dir)}
        collector_url = f"http://{settings.host}:{settings.port}"
        stack.spawn("collector", [sys.executable, "-m", "jobsight", "collector"], env)
        _wait_ready("collector", f"{collector_url}/readyz", stack.children[-1][1])
        dashboard_url = f"http://{settings.host}:{settings.dashboard_port}"
        if not args.no_dashboard:
            stack.spawn("dashboard", streamlit_argv(settings.host, settings.dashboard_port), env)
            _wait_ready("dashboard", f"{dashboard_url}/_stcore/health", stack.children[-1][1])
        if args.demo:
            demo_env = {**env, "JOBSIGHT_URL": collector_url}
            stack.spawn("demo", [sys.executable, "-m", "jobsight.agent.training.demo"], demo_env)
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
