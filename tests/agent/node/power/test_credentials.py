"""The BMC's credential files are root's: one that group or others could read or change, or that
another user owns, is never used.

At start the daemon says so once, naming the setting and the file (never its content), and runs
without node power; a file made unsafe later fails each reading before anything is sent or run
(no BMC is needed to see it: the check comes first). Real files, real modes, a real ``chown``.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from jobsight.agent.node.power.ipmi import IpmiTarget, read_ipmi_power_w
from jobsight.agent.node.power.reader import PowerReadError
from jobsight.agent.node.power.redfish import RedfishReader, RedfishTarget
from jobsight.agent.node.power.sources import build_node_energy
from jobsight.agent.settings import AgentSettings

PASSWORD = "s3cret-pw-4711"
UNSAFE_MODES = (0o640, 0o604, 0o620, 0o602, 0o644, 0o660, 0o666)
NOBODY = 65534


def _secret(tmp_path: Path, mode: int, name: str = "secret") -> str:
    path = tmp_path / name
    path.write_text(f"monitor:{PASSWORD}\n")
    path.chmod(mode)
    return str(path)


def _ipmi(path: str) -> IpmiTarget:
    # A closed port: ipmitool would fail to reach it, but it is never run for an unsafe file.
    return IpmiTarget(ipmitool="/nonexistent/ipmitool", host="127.0.0.1", port=9, user="monitor", password_file=path)


def _redfish(path: str) -> RedfishReader:
    return RedfishReader(RedfishTarget("https://127.0.0.1:9", path, timeout_s=1.0))


def _readings(path: str) -> list[Callable[[], float]]:
    """One reading of each source with the credential file at ``path``."""
    return [functools.partial(read_ipmi_power_w, _ipmi(path)), _redfish(path).power_w]


@pytest.mark.parametrize("mode", UNSAFE_MODES, ids=[f"{m:04o}" for m in UNSAFE_MODES])
def test_a_file_open_to_group_or_others_is_refused_at_each_reading(tmp_path: Path, mode: int) -> None:
    path = _secret(tmp_path, mode)
    for read in _readings(path):
        with pytest.raises(PowerReadError) as refused:
            read()
        message = str(refused.value)
        assert path in message and f"mode {mode:04o}" in message and "chmod 600" in message, message
        assert PASSWORD not in message and "monitor" not in message


def test_a_file_closed_to_others_is_used(tmp_path: Path) -> None:
    """0600 and 0400 pass the check: the reading goes on, and fails only where there is no BMC."""
    for mode in (0o600, 0o400):
        path = _secret(tmp_path, mode, f"ok-{mode:o}")
        with pytest.raises(PowerReadError, match="not found .*ipmitool package"):
            read_ipmi_power_w(_ipmi(path))
        with pytest.raises(PowerReadError, match="refused|timed out|no answer") as unreachable:
            _redfish(path).power_w()
        assert "credential" not in str(unreachable.value)


def test_a_file_another_user_owns_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    path = _secret(tmp_path, 0o600)
    os.chown(path, NOBODY, -1)
    for read in _readings(path):
        with pytest.raises(PowerReadError) as refused:
            read()
        message = str(refused.value)
        assert path in message and f"owned by uid {NOBODY}" in message and PASSWORD not in message, message


@pytest.mark.parametrize("source", ["ipmi", "redfish"])
def test_the_daemon_starts_without_node_power_and_says_why_once(
        tmp_path: Path, source: str, caplog: pytest.LogCaptureFixture) -> None:
    path = _secret(tmp_path, 0o644)
    # No ipmitool to run: the source built below reads nothing, so its background reader cannot reach a BMC
    # another test runs on this host's port 623 and say so in that test's log.
    fields = ({"ipmi_host": "127.0.0.1", "ipmi_user": "monitor", "ipmi_password_file": path,
               "ipmitool": "/nonexistent/ipmitool"} if source == "ipmi"
              else {"redfish_url": "https://127.0.0.1:9", "redfish_credentials_file": path})
    settings = AgentSettings(power_source=source, **fields)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="jobsight.agent.power"):
        assert build_node_energy(settings) is None  # no source, no exception: the daemon goes on
    said = [record.getMessage() for record in caplog.records]
    setting = "JOBSIGHT_IPMI_PASSWORD_FILE" if source == "ipmi" else "JOBSIGHT_REDFISH_CREDENTIALS_FILE"
    assert len(said) == 1 and setting in said[0] and path in said[0] and "node power off" in said[0], said
    assert PASSWORD not in said[0]
    # The same settings with the file closed to others build the source.
    os.chmod(path, 0o600)
    energy = build_node_energy(settings)
    assert energy is not None
    energy.close()
