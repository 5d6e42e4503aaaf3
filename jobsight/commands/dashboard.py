"""``jobsight dashboard``: the Streamlit dashboard, from wherever jobsight is installed.

Streamlit runs the app as a script by path, so users need not know where pip put it. The settings
are checked before Streamlit starts, so a dashboard that would trust anyone's identity header never
listens at all.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import jobsight.dashboard
from jobsight.collector.config.settings import SettingsError
from jobsight.commands.cli_error import CliError
from jobsight.dashboard.proxy_trust import NO_FORWARDED_FOR, bind_problem
from jobsight.dashboard.settings import DashboardSettings, load_dashboard_settings

SERVER = Path(jobsight.dashboard.__file__).resolve().parent / "serve.py"
"""What ``streamlit run`` runs: the dashboard app (``app.py``) in its server (:mod:`jobsight.dashboard.serve`)."""


def streamlit_argv(host: str, port: int) -> list[str]:
    """The command that serves the dashboard on ``host:port``, headless, with no usage stats, and
    without Streamlit's developer toolbar: its "Deploy" button offers to publish the dashboard to
    Streamlit's cloud, which is no part of jobsight (``minimal`` keeps only what the app sets).

    Two of Streamlit's conveniences for a script's author are off, as a served dashboard needs neither:
    "magic", which rewrites each page's source so that a bare expression is drawn (it drew a stray
    docstring on a page once, and rewriting the job page cost 75 ms of every page opened when no
    other session was open, as Streamlit then drops its compiled pages), and the watch on the
    source files, which reruns pages when the installed code changes.

    Nor does it collect all of Python's garbage after every run of a page (``runner.postScriptGC``):
    that full collection, after each page opened and each live part's refresh, held the interpreter
    for about a tenth of a second while the page's last messages waited to be sent. Python's own
    collector still runs as objects come and go."""
    return [
        sys.executable, "-m", "streamlit", "run", str(SERVER),
        "--server.address", host, "--server.port", str(port),
        "--server.headless", "true", "--browser.gatherUsageStats", "false",
        "--client.toolbarMode", "minimal",
        "--runner.magicEnabled", "false", "--server.fileWatcherType", "none",
        "--runner.postScriptGC", "false",
    ]


def streamlit_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` for the Streamlit process, with the peer address left as the connection's own (see
    :data:`~jobsight.dashboard.proxy_trust.NO_FORWARDED_FOR`): header mode trusts by that address."""
    variable, value = NO_FORWARDED_FOR
    return {**base, variable: value}


def checked_settings(host: str) -> DashboardSettings:
    """The dashboard's settings, when it may listen on ``host`` with them; otherwise a one-line
    :class:`CliError` naming what to set."""
    try:
        settings = load_dashboard_settings()
    except SettingsError as exc:
        raise CliError(str(exc)) from exc
    problem = bind_problem(settings, host)
    if problem is not None:
        raise CliError(f"refusing to start: {problem}")
    return settings


def configure_parser(name: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8501, help="listen port (default 8501)")


def run(name: str, args: argparse.Namespace) -> int:
    checked_settings(args.host)
    argv = streamlit_argv(args.host, args.port)
    # The dashboard replaces this process, so signals reach Streamlit directly.
    os.execve(argv[0], argv, streamlit_env(os.environ))
