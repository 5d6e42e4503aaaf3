"""``jobsight dashboard``: the Streamlit dashboard, from wherever jobsight is installed.

Streamlit runs the app as a script by path, so users need not know where pip put it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import jobsight.dashboard

APP = Path(jobsight.dashboard.__file__).resolve().parent / "app.py"


def streamlit_argv(host: str, port: int) -> list[str]:
    """The command that serves the dashboard on ``host:port``, headless, with no usage stats, and
    without Streamlit's developer toolbar: its "Deploy" button offers to publish the dashboard to
    Streamlit's cloud, which is no part of jobsight (``minimal`` keeps only what the app sets)."""
    return [
        sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.address", host, "--server.port", str(port),
        "--server.headless", "true", "--browser.gatherUsageStats", "false",
        "--client.toolbarMode", "minimal",
    ]


def configure_parser(name: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8501, help="listen port (default 8501)")


def run(name: str, args: argparse.Namespace) -> int:
    argv = streamlit_argv(args.host, args.port)
    os.execv(argv[0], argv)  # the dashboard replaces this process, so signals reach Streamlit directly
