"""``jobsight up``: embedded PostgreSQL (or ``JOBSIGHT_DATABASE_URL``), the collector and the
dashboard, and with ``--demo`` a first look that shows everything: a whole install on one machine.

``--demo`` adds a small real CPU training job (:mod:`jobsight.agent.training.demo`) and a clearly
labelled simulated cluster: a live 2-node × 8-GPU job whose rank 11 falls behind and then hangs
(:mod:`jobsight.commands.demo_cluster`), 30 days of finished simulated jobs for the audit pages
(:mod:`jobsight.commands.demo_history`), and a local sink the findings' alerts go to
(:mod:`jobsight.commands.demo_sink`). Without ``--demo`` nothing simulated is written.

The console shows one line per component with its URL; what the components themselves print
(uvicorn, Streamlit, Lightning) goes to log files under ``<data dir>/logs``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import IO
from urllib.parse import urlencode

from jobsight.collector.config.settings import CollectorSettings, SettingsError
from jobsight.commands.cli_error import CliError
from jobsight.commands.dashboard import checked_settings, streamlit_argv, streamlit_env
from jobsight.commands.demo_settings import DemoSettings, load_demo_settings
from jobsight.commands.server import load_settings
from jobsight.protocol.terminal_text import terminal_safe
from jobsight.rules import links

log = logging.getLogger("jobsight.up")

OPTIONAL = ("demo job", "simulated cluster")
"""Children whose end does not stop the rest: the demo job ends by itself after its minutes."""


def configure_parser(name: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--demo", action="store_true",
                        help="also run a small real CPU training job and a simulated 16-GPU cluster with 30 days "
                             "of history (all labelled simulated)")
    parser.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")


def run(name: str, args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # Alembic says every migration it applies at INFO: a wall of lines on a first start.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    demo: DemoSettings | None = None
    if args.demo:
        try:
            demo = load_demo_settings()
        except SettingsError as exc:
            raise CliError(str(exc)) from exc
    settings = load_settings()
    if not args.no_dashboard:
        checked_settings(settings.host)  # before anything starts: header mode off loopback must name its proxies
    return run_up(settings, args, demo)


def _tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` of a child's log, each terminal-safe: a log line may quote a job's name."""
    try:
        return "\n".join(terminal_safe(line) for line in path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class _Stack:
    """The processes `jobsight up` started, stopped in reverse order exactly once."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.children: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self._files: list[IO[bytes]] = []
        self.database: object | None = None
        self.sink: object | None = None

    def spawn(self, label: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start ``argv`` with its output in ``<logs>/<label>.log``."""
        path = self.logs / f"{label.replace(' ', '-')}.log"
        out = open(path, "ab")  # noqa: SIM115 - kept open for the child's life, closed in stop()
        self._files.append(out)
        child = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.children.append((label, child, path))
        return child

    def failed(self, label: str, child: subprocess.Popen[bytes], path: Path, what: str) -> CliError:
        """The error for a child that ``what`` (exited, was not ready), with the end of its log on stderr."""
        tail = _tail(path)
        if tail:
            print(f"--- last lines of {path} ---\n{tail}\n---", file=sys.stderr)
        return CliError(f"the {label} {what}; its log is {path}", code=1)

    def stop(self) -> None:
        for label, child, _ in reversed(self.children):
            if child.poll() is None:
                child.terminate()
                try:
                    child.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    log.warning("%s did not stop in 20 s; killing it", label)
                    child.kill()
                    child.wait()
        self.children.clear()
        for out in self._files:
            out.close()
        self._files.clear()
        sink, self.sink = self.sink, None
        if sink is not None:
            sink.stop()  # type: ignore[attr-defined]
        database, self.database = self.database, None
        if database is not None:
            database.stop()  # type: ignore[attr-defined]


def _wait_ready(stack: _Stack, url: str, timeout: float = 90) -> None:
    """Wait until ``url`` answers 200, so the URLs we print work when the user clicks them."""
    import urllib.error
    import urllib.request

    label, child, path = stack.children[-1]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise stack.failed(label, child, path, f"exited with code {child.returncode} during start-up")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    raise stack.failed(label, child, path, f"at {url} was not ready after {timeout:.0f} s")


def _announce(line: str) -> None:
    # The demo's alert sink announces what reached it: an alert's title, or whatever a local process posted.
    print(f"  {terminal_safe(line)}", flush=True)


def _demo_alert_sink(stack: _Stack, env: dict[str, str], settings: CollectorSettings) -> str:
    """Start the local alert sink and make it the collector's, unless alerts are configured already;
    returns the console line about it."""
    from jobsight.commands.demo_sink import DemoAlertSink

    if settings.alerts.sinks:
        return "alerts       to the sinks of your alert settings"
    sink = DemoAlertSink(stack.logs / "demo-alerts.log", announce=_announce)
    sink.start()
    stack.sink = sink
    env["JOBSIGHT_ALERTS_SINKS"] = sink.sink_setting()
    return f"alerts       a local demo sink: each alert is a line here, and in {sink.log_path}"


def _history_line(written: int, days: int, audit_url: str | None) -> str:
    if not days:
        return "history      none (JOBSIGHT_DEMO_HISTORY_DAYS=0)"
    what = f"{written} simulated jobs over the last {days} days" if written else "written by an earlier start"
    return f"history      {what}" + (f", on {audit_url}" if audit_url else "")


def run_up(settings: CollectorSettings, args: argparse.Namespace, demo: DemoSettings | None = None) -> int:
    from jobsight.collector.api.auth import ensure_admin_token, ensure_cluster_secret
    from jobsight.collector.store import migrate
    from jobsight.collector.store.embedded_db import EmbeddedDatabaseError, EmbeddedPostgres

    logs = settings.data_dir / "logs"
    stack = _Stack(logs)
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        logs.mkdir(parents=True, exist_ok=True)
        database_url = settings.database_url
        if not database_url:
            database = EmbeddedPostgres(settings.data_dir / "postgres")
            stack.database = database
            try:
                database_url = database.start()
            except EmbeddedDatabaseError as exc:
                raise CliError(str(exc), code=1) from exc
        migrate.upgrade(database_url)
        token_file = settings.resolved_admin_token_file()
        ensure_admin_token(token_file)
        # A trial install mints job and node tokens too, so it needs the secret they are signed with.
        ensure_cluster_secret(settings.resolved_secret_file())
        env = {**os.environ, "JOBSIGHT_DATABASE_URL": database_url, "JOBSIGHT_DATA_DIR": str(settings.data_dir)}
        dashboard_url = f"http://{settings.host}:{settings.dashboard_port}"
        if not args.no_dashboard and "JOBSIGHT_DASHBOARD_URL" not in os.environ:
            env["JOBSIGHT_DASHBOARD_URL"] = dashboard_url  # the links in alerts and reports point at this one
        lines: list[str] = []
        history = 0
        if demo is not None:
            from jobsight.commands.demo_history import write_history

            # Before the collector starts: its compaction and health timers then find it all there.
            history = write_history(database_url, demo.history_days, seed=demo.seed)
            lines.append(_demo_alert_sink(stack, env, settings))
        collector_url = f"http://{settings.host}:{settings.port}"
        stack.spawn("collector", [sys.executable, "-m", "jobsight", "collector"], env)
        _wait_ready(stack, f"{collector_url}/readyz")
        if not args.no_dashboard:
            stack.spawn("dashboard", streamlit_argv(settings.host, settings.dashboard_port), streamlit_env(env))
            _wait_ready(stack, f"{dashboard_url}/_stcore/health")

        def job_url(cluster: str, job: str) -> str:
            if args.no_dashboard:
                return f"{collector_url}/v1/jobs/{job}?{urlencode({'cluster': cluster})}"
            return links.job_link(cluster, job, base=dashboard_url)

        if demo is not None:
            from jobsight.commands.demo_cluster import job_id_at
            from jobsight.commands.demo_story import CLUSTER

            agent_env = {**env, "JOBSIGHT_URL": collector_url, "JOBSIGHT_TOKEN_FILE": str(token_file)}
            demo_job = f"demo-{socket.gethostname()}-{int(time.time())}"
            stack.spawn("demo job", [sys.executable, "-m", "jobsight.agent.training.demo"],
                        {**agent_env, "JOBSIGHT_JOB_ID": demo_job})
            simulated = job_id_at(time.time() - demo.headstart_s)
            stack.spawn("simulated cluster", [sys.executable, "-m", "jobsight.commands.demo_cluster",
                                              "--first-job-id", simulated], agent_env)
            lines[:0] = [
                f"demo job     {job_url(settings.cluster, demo_job)}  (a real CPU training run, Lightning)",
                f"simulated    {job_url(CLUSTER, simulated)}  (2 nodes × 8 simulated GPUs; rank 11 falls behind, "
                "then hangs)",
                _history_line(history, demo.history_days,
                              None if args.no_dashboard else links.page_link("audit", {}, base=dashboard_url)),
            ]
        print("jobsight is up")
        print(f"  collector    {collector_url}  (API docs: {collector_url}/docs)")
        if not args.no_dashboard:
            print(f"  dashboard    {dashboard_url}")
        for line in lines:
            print(f"  {line}")
        print(f"  data         {settings.data_dir}  (admin token: {token_file}; logs: {logs})")
        print("Press Ctrl-C to stop.", flush=True)
        warned: set[str] = set()
        while not stopping:
            for label, child, path in stack.children:
                if child.poll() is None or label in warned:
                    continue
                if label not in OPTIONAL:
                    raise stack.failed(label, child, path, f"exited with code {child.returncode}")
                warned.add(label)
                if child.returncode != 0:
                    _announce(f"the {label} exited with code {child.returncode}; its log is {path}")
            time.sleep(0.5)
        print("stopping jobsight ...", flush=True)
        return 0
    finally:
        stack.stop()
