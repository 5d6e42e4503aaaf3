"""The node's power from its BMC over IPMI, through ``ipmitool``.

The BMC's DCMI power reading (``ipmitool dcmi power reading``) is whole-node power as the board
measures it. A BMC without DCMI usually has a power sensor instead (``Pwr Consumption``,
``Total_Power``…); naming it in :class:`IpmiTarget` reads it with ``ipmitool sdr get <name>``,
whose answer carries the sensor's unit, so a sensor in amps is refused rather than taken for watts.

``ipmitool`` rather than an IPMI library: it is in every distribution and every site already
trusts it, and the RMCP+ session (RAKP, HMAC, AES) is not something to write again here. Each
read is one short-lived process, run by :class:`~jobsight.agent.node.power.reader.BackgroundPowerReader`
on its own thread, so a BMC that stops answering costs that thread ``timeout_s``, never the tick.

Secrets: the password reaches ipmitool as a file (``-f``), never as ``-P``: a command line is
readable in ``/proc/<pid>/cmdline`` by every local user. Nothing here reads the password, so no
message can hold it. The file must be root's (or the daemon's user's) and closed to group and others
(:mod:`jobsight.agent.node.power.credential_files`), checked before each run of ipmitool.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from typing import Final

from jobsight.agent.node.power.credential_files import UnsafeCredentialFile, check_credential_file
from jobsight.agent.node.power.reader import PowerReadError

_INTERFACES: Final = ("lanplus", "lan", "open")
_PRIVILEGES: Final = ("USER", "OPERATOR", "ADMINISTRATOR")
_DCMI_WATTS: Final = re.compile(r"Instantaneous power reading:\s*(\d+(?:\.\d+)?)\s*Watts", re.IGNORECASE)
_DCMI_STATE: Final = re.compile(r"Power reading state is:\s*(\w+)", re.IGNORECASE)
_SENSOR_READING: Final = re.compile(
    r"^\s*Sensor Reading\s*:\s*([-+]?\d+(?:\.\d+)?)\s*(?:\(\+/-\s*[^)]*\))?\s*(.*?)\s*$", re.MULTILINE
)
# What ipmitool says when the BMC refused the user or the password (matched without case). With
# RMCP+ (lanplus) a wrong password shows only as "RAKP 2 HMAC is invalid", which ipmitool prints
# at -v alone, hence -v on the LAN interfaces. With IPMI 1.5 (lan) the BMC drops an activation
# signed with the wrong password, and ipmitool says "Activate Session command failed".
_REFUSED: Final = (
    "rakp 2 hmac is invalid",
    "invalid integrity check value",
    "unauthorized name",
    "unauthorized role",
    "invalid name length",
    "invalid user name",
    "null user name not enabled",
    "activate session command failed",
    "requested privilege level exceeds limit",
)
_REASON_MAX: Final = 200


@dataclass(frozen=True)
class IpmiTarget:
    """Which BMC to read and how to reach it."""

    ipmitool: str = "ipmitool"
    """The ipmitool executable (a name looked up in ``PATH``, or a path)."""
    host: str | None = None
    """The BMC's address; ``None`` reads this node's own BMC in-band (``-I open``, ``/dev/ipmi0``),
    whatever ``interface`` says."""
    port: int = 623
    user: str | None = None
    """``None``: the BMC's anonymous user."""
    password_file: str | None = None
    """A file whose first line is the password, given to ipmitool with ``-f`` (never ``-P``)."""
    sensor: str | None = None
    """A power sensor's name (``ipmitool sdr list``) to read when the BMC has no DCMI."""
    timeout_s: float = 5.0
    """The whole ipmitool run, session setup and SDR walk included; it is killed past this."""
    interface: str = "lanplus"
    """``lanplus`` (IPMI 2.0, RMCP+) or ``lan`` (IPMI 1.5; old BMCs, simulators) to reach ``host``;
    ``open`` (in-band) only without one."""
    cipher_suite: int | None = None
    """ipmitool's ``-C``; ``None`` lets ipmitool ask the BMC, which costs a timeout on BMCs
    (and ``ipmi_sim``) that do not answer Get Channel Cipher Suites."""
    privilege: str = "USER"
    """The session's privilege (ipmitool's ``-L``). Reading power needs User; ipmitool's default,
    Administrator, is refused to the read-only accounts monitoring should use."""

    def __post_init__(self) -> None:
        if self.interface not in _INTERFACES:
            raise ValueError(f"IPMI interface must be one of {', '.join(_INTERFACES)}, not {self.interface!r}")
        if self.interface == "open" and self.host is not None:
            raise ValueError(f"IPMI interface open reads the local BMC, not {self.host}: use lanplus or lan")
        if self.privilege not in _PRIVILEGES:
            raise ValueError(f"IPMI privilege must be one of {', '.join(_PRIVILEGES)}, not {self.privilege!r}")
        if not 0 < self.port < 65536:
            raise ValueError(f"IPMI port {self.port} is out of range")
        if not self.timeout_s > 0:
            raise ValueError(f"IPMI timeout must be positive, not {self.timeout_s!r}")

    def where(self) -> str:
        """The BMC as messages name it."""
        return "the local BMC" if self.host is None else f"the BMC at {self.host}:{self.port}"


def ipmitool_argv(target: IpmiTarget) -> list[str]:
    """The ipmitool command line that reads ``target``'s power (no secret is ever on it)."""
    argv = [target.ipmitool]
    if target.host is None:
        argv += ["-I", "open"]
    else:
        # ipmitool gives up by itself after about 2 x -N seconds at -R 1 (it lengthens each retry's
        # wait); kept under timeout_s so it can say why rather than be killed.
        wait_s = max(1, int(target.timeout_s / 2.5))
        argv += ["-I", target.interface, "-H", target.host, "-p", str(target.port),
                 "-N", str(wait_s), "-R", "1", "-v", "-L", target.privilege]
        if target.cipher_suite is not None:
            argv += ["-C", str(target.cipher_suite)]
        if target.user is not None:
            argv += ["-U", target.user]
        if target.password_file is not None:
            argv += ["-f", target.password_file]
    if target.sensor is None:
        argv += ["dcmi", "power", "reading"]
    else:
        argv += ["sdr", "get", target.sensor]
    return argv


def read_ipmi_power_w(target: IpmiTarget) -> float:
    """The node's power in watts, as the BMC reports it now.

    Raises :class:`PowerReadError` (``refused=True`` when the BMC refused the user or password)
    with a one-line reason that never holds the password.
    """
    if target.password_file is not None and target.host is not None:
        check_password_file(target.password_file)
    try:
        done = subprocess.run(
            ipmitool_argv(target),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=target.timeout_s,
            # No controlling terminal: ipmitool can never stop to ask for a password.
            start_new_session=True,
            check=False,
        )
    except FileNotFoundError:
        raise PowerReadError(f"{target.ipmitool} not found (install the ipmitool package)") from None
    except subprocess.TimeoutExpired as exc:
        _raise_if_refused(target, _text(exc.stderr))
        raise PowerReadError(f"{target.where()} did not answer within {target.timeout_s:g} s") from None
    except OSError as exc:
        raise PowerReadError(f"cannot run {target.ipmitool}: {exc.strerror or exc}") from None
    out, err = _text(done.stdout), _text(done.stderr)
    _raise_if_refused(target, err)
    if done.returncode != 0:
        raise PowerReadError(f"ipmitool failed on {target.where()} (exit {done.returncode}): {_reason(err, out)}")
    if target.sensor is None:
        return _parse_dcmi(target, out, err)
    return _parse_sensor(target, out, err)


def check_password_file(path: str) -> None:
    """Raise :class:`PowerReadError` (naming the file, never its content) unless ``path`` is a password
    file ipmitool can read that nobody but root or the daemon's user can read or change."""
    if not os.access(path, os.R_OK):
        # ipmitool would fall back to prompting for the password on the terminal.
        raise PowerReadError(f"cannot read the IPMI password file {path}")
    try:
        check_credential_file(path)
    except OSError as exc:
        raise PowerReadError(f"cannot read the IPMI password file {path}: {exc.strerror or type(exc).__name__}") \
            from None
    except UnsafeCredentialFile as exc:
        raise PowerReadError(f"not using the IPMI password file: {exc}") from None


def _parse_dcmi(target: IpmiTarget, out: str, err: str) -> float:
    found = _DCMI_WATTS.search(out)
    if found is None:
        raise PowerReadError(f"no DCMI power reading from {target.where()}: {_reason(err, out)}")
    watts = float(found.group(1))
    state = _DCMI_STATE.search(out)
    if watts == 0 and state is not None and state.group(1).lower() == "deactivated":
        # A live node never draws 0 W: the BMC is not measuring.
        raise PowerReadError(f"{target.where()} reports 0 W with DCMI power measurement deactivated")
    return watts


def _parse_sensor(target: IpmiTarget, out: str, err: str) -> float:
    found = _SENSOR_READING.search(out)
    if found is None:
        # A missing sensor exits 0 with no reading and says so on stderr.
        raise PowerReadError(f"no reading of sensor {target.sensor!r} from {target.where()}: {_reason(err, out)}")
    value, unit = found.group(1), found.group(2) or "(no unit)"
    if unit.lower() != "watts":
        raise PowerReadError(f"sensor {target.sensor!r} on {target.where()} reads {value} {unit}, not Watts")
    return float(value)


def _raise_if_refused(target: IpmiTarget, err: str) -> None:
    for line in err.splitlines():
        if any(marker in line.lower() for marker in _REFUSED):
            who = f"user {target.user!r}" if target.user is not None else "the anonymous user"
            said = _clip(line.lstrip("> "))
            raise PowerReadError(f"{target.where()} refused {who} ({said}): wrong user or password?", refused=True)


def _reason(err: str, out: str) -> str:
    """ipmitool's own conclusion: its last line on stderr (at -v the first lines are chatter such as
    "Loading IANA PEN Registry..."), else the first line of its output."""
    for text, pick in ((err, -1), (out, 0)):
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if lines:
            return _clip(lines[pick])
    return "it said nothing"


def _clip(line: str) -> str:
    line = line.strip()
    return line if len(line) <= _REASON_MAX else line[: _REASON_MAX - 1] + "…"


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    if isinstance(data, bytes):
        return data.decode("utf-8", errors="replace")
    return data
