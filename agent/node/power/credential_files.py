"""The BMC's credential files (the IPMI password file, the Redfish ``user:password`` file): root's
secrets, used only where nobody else can read or replace them.

A file that group or others may read gives the BMC's password to every local user (a job's user
among them); one they may write, or that another user owns, lets them choose the credentials the
daemon sends and the BMC it trusts with them. Such a file is refused, as ssh refuses a private key
of the same modes, with a message that names the file and its mode or owner, never its content.
The daemon then runs without that power source (:mod:`jobsight.agent.node.power.sources`), and a
file that becomes unsafe later fails each reading the same way, said once per outage.
"""

from __future__ import annotations

import os
import stat
from typing import Final

GROUP_OR_OTHERS: Final = 0o077
"""Any access for the group or others: read, write or execute (as ssh judges a private key)."""


class UnsafeCredentialFile(ValueError):
    """A credential file that someone other than root or the daemon's user could read or change.
    The message names the file and why, never its content."""


def check_credential_stat(path: str, found: os.stat_result) -> None:
    """Raise :class:`UnsafeCredentialFile` unless ``found`` (the file at ``path``, as ``stat`` or
    ``fstat`` saw it) is a regular file owned by root or by this process's user, with no access for
    the group or others."""
    if not stat.S_ISREG(found.st_mode):
        raise UnsafeCredentialFile(f"the credential file {path} is not a regular file")
    owners = {0, os.geteuid()}
    if found.st_uid not in owners:
        raise UnsafeCredentialFile(
            f"the credential file {path} is owned by uid {found.st_uid}, not by root or the daemon's user "
            f"(uid {os.geteuid()}): chown it")
    mode = stat.S_IMODE(found.st_mode)
    if mode & GROUP_OR_OTHERS:
        raise UnsafeCredentialFile(
            f"the credential file {path} has mode {mode:04o}, open to group or others: chmod 600 {path}")


def check_credential_file(path: str) -> None:
    """Raise :class:`UnsafeCredentialFile` unless the file at ``path`` passes
    :func:`check_credential_stat`; ``OSError`` when it cannot be looked at (absent, no access)."""
    check_credential_stat(path, os.stat(path))
