"""``jobsight slurm prolog|epilog|task-prolog``: what the ``slurm/`` wrappers run.

The hooks themselves are :mod:`jobsight.agent.slurm.hooks`; they always exit 0.
"""

from __future__ import annotations

import argparse

from jobsight.agent.slurm.hooks import HOOKS, run_hook


def configure_parser(name: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("hook", choices=HOOKS, help="which Slurm hook is running")


def run(name: str, args: argparse.Namespace) -> int:
    return run_hook(args.hook)
