"""The node power source a site chose (``JOBSIGHT_POWER_SOURCE``), built from the agent's settings.

A BMC credential file that group or others could read or change, or that another user owns, is
refused at start with one warning naming the setting and the file (never its content), and the
daemon runs without node power (:mod:`jobsight.agent.node.power.credential_files`); it never stops for it.
"""

from __future__ import annotations

import logging

from jobsight.agent.node.power.credential_files import UnsafeCredentialFile, check_credential_file
from jobsight.agent.node.power.ipmi import IpmiTarget, read_ipmi_power_w
from jobsight.agent.node.power.node_energy import BmcPower, NodeEnergy, PowerSource
from jobsight.agent.node.power.rapl import RaplCounters
from jobsight.agent.node.power.reader import BackgroundPowerReader
from jobsight.agent.node.power.redfish import RedfishReader, RedfishTarget
from jobsight.agent.settings import AgentSettings

log = logging.getLogger("jobsight.agent.power")

STALE_AFTER_READS = 3
"""A BMC reading older than this many read intervals is not used: the BMC stopped answering."""


def _credentials_refused(setting: str, path: str | None) -> bool:
    """Whether the credential file of ``setting`` is one the daemon must not use (said once, naming the
    file and why, never its content); ``False`` for no file, or one that cannot be looked at yet (each
    reading says so until it can)."""
    if path is None:
        return False
    try:
        check_credential_file(path)
    except UnsafeCredentialFile as exc:
        log.warning("jobsight agent: %s: %s; node power off", setting, exc)
        return True
    except OSError:
        return False
    return False


def _bmc(settings: AgentSettings) -> BackgroundPowerReader | None:
    interval = settings.power_interval_s
    if settings.power_source == "ipmi":
        if settings.ipmi_host and _credentials_refused("JOBSIGHT_IPMI_PASSWORD_FILE", settings.ipmi_password_file):
            return None
        try:
            target = IpmiTarget(
                ipmitool=settings.ipmitool, host=settings.ipmi_host, port=settings.ipmi_port, user=settings.ipmi_user,
                password_file=settings.ipmi_password_file, sensor=settings.ipmi_sensor,
                interface=settings.ipmi_interface if settings.ipmi_host else "open",
                timeout_s=min(interval, 5.0))
        except ValueError as exc:
            log.warning("jobsight agent: the IPMI settings %s; node power off", exc)
            return None
        return BackgroundPowerReader("ipmi", lambda: read_ipmi_power_w(target), interval)
    if settings.redfish_url is None:
        log.warning("jobsight agent: JOBSIGHT_POWER_SOURCE=redfish needs JOBSIGHT_REDFISH_URL; node power off")
        return None
    if _credentials_refused("JOBSIGHT_REDFISH_CREDENTIALS_FILE", settings.redfish_credentials_file):
        return None
    try:
        reader = RedfishReader(RedfishTarget(
            url=settings.redfish_url, credentials_file=settings.redfish_credentials_file,
            ca_file=settings.redfish_ca_file, chassis=settings.redfish_chassis, timeout_s=min(interval, 5.0)))
    except ValueError as exc:
        log.warning("jobsight agent: JOBSIGHT_REDFISH_URL %s; node power off", exc)
        return None
    return BackgroundPowerReader("redfish", reader.power_w, interval)


def build_node_energy(settings: AgentSettings, proc_root: str = "/proc") -> NodeEnergy | None:
    """The node's energy meter, its BMC reader started; ``None`` for ``none`` (the GPUs' energy alone)."""
    source: PowerSource
    if settings.power_source == "rapl":
        source = RaplCounters(settings.powercap_root)
    elif settings.power_source in ("ipmi", "redfish"):
        reader = _bmc(settings)
        if reader is None:
            return None
        reader.start()
        source = BmcPower(reader, STALE_AFTER_READS * settings.power_interval_s)
    else:
        return None
    return NodeEnergy(source, settings.power_idle_split, proc_root=proc_root)
