"""The ``jobsight`` command.

Each subcommand lives in its own module under :mod:`jobsight.commands`, imported only
when it runs: node-side ones (``agent``, ``slurm``, ``report``) need only the standard
library and ``jobsight.agent``, so a node with only the ``agent`` extra never imports
the collector's dependencies.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from jobsight.commands.cli_error import CliError

# subcommand -> (module that adds its arguments and runs it, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "up": ("jobsight.commands.up", "start embedded PostgreSQL, the collector and the dashboard"),
    "collector": ("jobsight.commands.server", "run the collector against JOBSIGHT_DATABASE_URL"),
    "migrate": ("jobsight.commands.server", "apply database migrations"),
    "compact": ("jobsight.commands.compact", "pack closed hours of GPU and host samples into the packed tier now"),
    "dashboard": ("jobsight.commands.dashboard", "run the Streamlit dashboard (put your auth proxy in front)"),
    "agent": ("jobsight.commands.agent", "run the node daemon: sample GPUs and ship them to the collector"),
    "slurm": ("jobsight.commands.slurm", "Slurm hooks: prolog, epilog, task-prolog (run by the slurm/ wrappers)"),
    "report": ("jobsight.commands.report", "print a job's efficiency report from the collector"),
}


def _module(name: str) -> Any:
    module_name, _ = SUBCOMMANDS[name]
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"`jobsight {name}` needs more of jobsight installed ({exc.name} is missing): "
                       "pip install 'jobsight[collector]'") from exc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jobsight", description="HPC job telemetry for GPU clusters")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.set_defaults(_name=name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0] not in SUBCOMMANDS:
        parser.parse_args(argv or ["--help"])
        return 2
    name = argv[0]
    try:
        module = _module(name)
        configure: Callable[[str, argparse.ArgumentParser], None] = module.configure_parser
        run: Callable[[str, argparse.Namespace], int] = module.run
        command_parser = argparse.ArgumentParser(prog=f"jobsight {name}", description=SUBCOMMANDS[name][1])
        configure(name, command_parser)
        args = command_parser.parse_args(argv[1:])
        return run(name, args)
    except CliError as exc:
        print(f"jobsight {name}: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
