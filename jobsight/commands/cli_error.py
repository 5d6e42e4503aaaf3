"""The error every subcommand raises for a problem the user can fix (:mod:`jobsight.cli` prints it)."""

from __future__ import annotations


class CliError(Exception):
    """A problem the user can fix; printed as one line, exit code ``code``."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code
