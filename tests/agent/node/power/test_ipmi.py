"""Node power from a BMC over IPMI: the real ``ipmitool`` against a real simulated BMC, OpenIPMI's
``ipmi_sim`` listening on 127.0.0.1 at a free UDP port.

The simulated BMC has no DCMI (``ipmi_sim`` does not implement it), so the power is read from a
sensor: ``Pwr Consumption``, unit Watts, whose SDR scales the raw byte by M = 2 (raw 110 is 220 W,
so the test sees ipmitool's conversion, not the byte). A second sensor, ``PSU1 Current``, is in Amps.
The BMC's user ``monitor`` has the User privilege only, as a read-only monitoring account would.

Needs Debian's ``openipmi`` (``ipmi_sim``) and ``ipmitool``; without them the tests skip and say
which package is missing, and with ``JOBSIGHT_REQUIRE_IPMI=1`` (CI) they fail instead.
``ipmi_sim`` runs with ``-p`` (no persistence) and its state directory under ``tmp_path``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobsight.agent.node.power.ipmi import IpmiTarget, ipmitool_argv, read_ipmi_power_w
from jobsight.agent.node.power.reader import BackgroundPowerReader, PowerReadError

PASSWORD = "s3cret-pw-4711"
WRONG_PASSWORD = "not-the-pw-0815"
SENSOR = "Pwr Consumption"
AMPS_SENSOR = "PSU1 Current"
LOGGER = "jobsight.agent.power"
START_TIMEOUT_S = 10.0


def _unavailable(reason: str) -> None:
    if os.environ.get("JOBSIGHT_REQUIRE_IPMI") == "1":
        pytest.fail(f"JOBSIGHT_REQUIRE_IPMI=1 but {reason}")
    pytest.skip(reason)


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _full_sensor_sdr(number: int, name: str, unit: int, m: int) -> list[int]:
    """An IPMI Full Sensor Record (type 01h) of a threshold sensor on the BMC (owner 20h), linear,
    value = M x raw, no thresholds."""
    body = [
        0x20, 0x00, number,           # owner, LUN, sensor number
        0x07, 0x01,                   # entity: system board, instance 1
        0x67, 0x88,                   # initialisation, capabilities
        0x03, 0x01,                   # sensor type (current, as BMCs file power), threshold reading
        0, 0, 0, 0, 0, 0,             # event and reading masks: none
        0x00, unit, 0x00, 0x00,       # unsigned; base unit (5 amps, 6 watts); no modifier; linear
        m, 0x00, 0x00, 0x00, 0x00, 0x00,  # M, tolerance, B, accuracy, exponents
        0x00, 0x00, 0xFF, 0x00, 0xFF, 0x00,  # flags, nominal, normal max/min, sensor max/min
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  # six thresholds, two hystereses, reserved, OEM
        0xC0 | len(name), *name.encode("ascii"),  # 8-bit ASCII id string
    ]
    return [0x00, 0x00, 0x51, 0x01, len(body), *body]


class SimulatedBmc:
    """One ``ipmi_sim`` process and its files under ``root``; restartable on the same port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = _free_udp_port()
        self.process: subprocess.Popen[bytes] | None = None
        (root / "state").mkdir(parents=True, exist_ok=True)
        (root / "lan.conf").write_text(
            'name "jobsight-test"\n'
            "set_working_mc 0x20\n"
            "  startlan 1\n"
            f"    addr 127.0.0.1 {self.port}\n"
            "    priv_limit admin\n"
            "    allowed_auths_callback md5\n"
            "    allowed_auths_user md5\n"
            "    allowed_auths_operator md5\n"
            "    allowed_auths_admin md5\n"
            "    guid a123456789abcdefa123456789abcdef\n"
            "  endlan\n"
            f'  user 2 true "monitor" "{PASSWORD}" user 10 md5\n'
        )

    def _emu(self, watts: int) -> str:
        lines = ["mc_setbmc 0x20", "mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02"]
        for number, name, unit, m, raw in ((2, SENSOR, 6, 2, watts // 2), (3, AMPS_SENSOR, 5, 1, 12)):
            sdr = " ".join(f"0x{byte:02x}" for byte in _full_sensor_sdr(number, name, unit, m))
            lines += [
                f"sensor_add 0x20 0 {number} 0x03 0x01",
                f"main_sdr_add 0x20 {sdr}",
                f"sensor_set_value 0x20 0 {number} {raw} 0",
                # Scanning on: otherwise the sensor reads "disabled", with no value.
                f"sensor_set_event_support 0x20 0 {number} enable scanning none "
                + " ".join(["000000000000000"] * 4),
            ]
        lines.append("mc_enable 0x20")
        return "\n".join(lines) + "\n"

    def target(self, **changes: Any) -> IpmiTarget:
        """The BMC as its user ``monitor`` reads it (cipher suite 3: ipmi_sim does not answer
        ipmitool's Get Channel Cipher Suites, which would cost a timeout on every read)."""
        base = IpmiTarget(host="127.0.0.1", port=self.port, user="monitor", password_file=str(self.root / "password"),
                          sensor=SENSOR, timeout_s=2.0, cipher_suite=3)
        return dataclasses.replace(base, **changes)

    def start(self, watts: int) -> None:
        """Starts the BMC with its power sensor at ``watts`` (even) and waits until it answers."""
        assert self.process is None
        (self.root / "sim.emu").write_text(self._emu(watts))
        with open(self.root / "ipmi_sim.log", "ab") as log:
            self.process = subprocess.Popen(
                ["ipmi_sim", "-c", "lan.conf", "-f", "sim.emu", "-s", "state", "-n", "-p"],
                cwd=self.root, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        probe = self.target(timeout_s=1.0)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                read_ipmi_power_w(probe)
                return
            except PowerReadError as exc:
                exited = self.process.poll()
                if exited is not None or time.monotonic() > deadline:
                    output = (self.root / "ipmi_sim.log").read_text(errors="replace")
                    raise AssertionError(f"ipmi_sim did not answer (exit {exited}): {exc}\n{output}") from exc
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None


@pytest.fixture
def bmc(tmp_path: Path) -> Iterator[SimulatedBmc]:
    """A running simulated BMC reporting 220 W, and the password file of its user ``monitor``."""
    for binary, package in (("ipmi_sim", "openipmi"), ("ipmitool", "ipmitool")):
        if shutil.which(binary) is None:
            _unavailable(f"{binary} not found: install the Debian package {package}")
    simulated = SimulatedBmc(tmp_path / "bmc")
    password = simulated.root / "password"
    password.write_text(PASSWORD + "\n")
    password.chmod(0o600)
    simulated.start(watts=220)
    try:
        yield simulated
    finally:
        simulated.stop()


@pytest.fixture
def power_log(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> pytest.LogCaptureFixture:
    """caplog at INFO for the power logger, which reaches it even after a hook's logging setup
    (``propagate = False`` on ``jobsight``) ran earlier in the session."""
    monkeypatch.setattr(logging.getLogger("jobsight"), "propagate", True)
    caplog.set_level(logging.INFO, logger=LOGGER)
    return caplog


def _said(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("interface", ["lanplus", "lan"])
def test_reads_the_power_sensor_over_lan(bmc: SimulatedBmc, interface: str) -> None:
    target = bmc.target(interface=interface)
    assert read_ipmi_power_w(target) == 220.0
    argv = ipmitool_argv(target)
    assert argv[argv.index("-I") + 1] == interface
    assert "-P" not in argv and PASSWORD not in " ".join(argv)
    assert argv[argv.index("-f") + 1] == target.password_file


@pytest.mark.parametrize(
    ("interface", "user", "password", "privilege"),
    [
        ("lanplus", "monitor", WRONG_PASSWORD, "USER"),
        ("lan", "monitor", WRONG_PASSWORD, "USER"),
        ("lanplus", "nobody", PASSWORD, "USER"),
        ("lan", "monitor", PASSWORD, "ADMINISTRATOR"),  # ipmitool's own default privilege
    ],
    ids=["lanplus-wrong-password", "lan-wrong-password", "lanplus-unknown-user", "lan-above-the-user-privilege"],
)
def test_wrong_credentials_are_refused(
    bmc: SimulatedBmc, interface: str, user: str, password: str, privilege: str
) -> None:
    wrong = bmc.root / "wrong-password"
    wrong.write_text(password + "\n")
    wrong.chmod(0o600)
    # 3 s: over IPMI 1.5 the BMC drops the wrong activation and ipmitool says so after its 2 s wait.
    target = bmc.target(interface=interface, user=user, password_file=str(wrong), timeout_s=3.0, privilege=privilege)
    with pytest.raises(PowerReadError) as caught:
        read_ipmi_power_w(target)
    assert caught.value.refused, str(caught.value)
    message = str(caught.value)
    assert "refused" in message and user in message
    assert PASSWORD not in message and WRONG_PASSWORD not in message


def test_a_missing_sensor_an_amps_sensor_and_no_dcmi_are_errors(bmc: SimulatedBmc) -> None:
    with pytest.raises(PowerReadError, match="Unable to find sensor id") as missing:
        read_ipmi_power_w(bmc.target(sensor="No Such Sensor"))
    assert not missing.value.refused
    with pytest.raises(PowerReadError, match="reads 12 Amps, not Watts"):
        read_ipmi_power_w(bmc.target(sensor=AMPS_SENSOR))
    # ipmi_sim has no DCMI: the DCMI reading (no sensor named) fails with ipmitool's reason.
    with pytest.raises(PowerReadError, match="DCMI request failed") as no_dcmi:
        read_ipmi_power_w(bmc.target(sensor=None))
    assert not no_dcmi.value.refused


def test_missing_ipmitool_and_unreadable_password_file(tmp_path: Path) -> None:
    absent = IpmiTarget(ipmitool=str(tmp_path / "no-ipmitool"), host="127.0.0.1", sensor=SENSOR)
    with pytest.raises(PowerReadError, match="not found .*ipmitool package"):
        read_ipmi_power_w(absent)
    # Checked before ipmitool runs: ipmitool itself would fall back to prompting on the terminal.
    no_file = IpmiTarget(host="127.0.0.1", user="monitor", password_file=str(tmp_path / "absent"))
    with pytest.raises(PowerReadError, match="cannot read the IPMI password file"):
        read_ipmi_power_w(no_file)
    with pytest.raises(ValueError):
        IpmiTarget(interface="serial")
    with pytest.raises(ValueError):
        IpmiTarget(host="127.0.0.1", interface="open")


def test_the_local_bmc_is_read_in_band() -> None:
    for interface in ("lanplus", "open"):
        argv = ipmitool_argv(IpmiTarget(interface=interface))
        assert argv == ["ipmitool", "-I", "open", "dcmi", "power", "reading"]


def test_an_outage_is_said_once_and_its_end_once(bmc: SimulatedBmc, power_log: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    target = bmc.target(timeout_s=1.0)
    reader = BackgroundPowerReader("ipmi", lambda: read_ipmi_power_w(target), interval_s=30.0, clock=clock)
    reader.read_once()
    reading = reader.latest(max_age_s=60.0)
    assert reading is not None and reading.watts == 220.0

    bmc.stop()
    for _ in range(3):
        clock.now += 30.0
        reader.read_once()
    assert reader.failures == 3
    warnings = _said(power_log, logging.WARNING)
    assert len(warnings) == 1, warnings
    assert "node power from ipmi unavailable" in warnings[0] and "did not answer" in warnings[0]
    assert PASSWORD not in power_log.text
    assert reader.latest(max_age_s=60.0) is None  # the last reading is 90 s old

    bmc.start(watts=230)
    clock.now += 30.0
    reader.read_once()
    assert _said(power_log, logging.INFO) == ["jobsight agent: node power from ipmi is back"]
    assert len(_said(power_log, logging.WARNING)) == 1
    fresh = reader.latest(max_age_s=60.0)
    assert fresh is not None and fresh.watts == 230.0 and fresh.at == clock.now


def test_latest_never_waits_for_a_hung_bmc(bmc: SimulatedBmc) -> None:
    """A BMC that stops answering (SIGSTOP: its packets queue, none is answered) holds the reader's
    thread in ipmitool, never the caller of ``latest``."""
    target = bmc.target(timeout_s=5.0)
    entered = threading.Event()
    finished = threading.Event()

    def fetch() -> float:
        entered.set()
        try:
            return read_ipmi_power_w(target)
        finally:
            finished.set()

    reader = BackgroundPowerReader("ipmi", fetch, interval_s=30.0)
    reader.read_once()
    entered.clear()
    finished.clear()
    assert bmc.process is not None
    bmc.process.send_signal(signal.SIGSTOP)
    try:
        reader.start()
        assert entered.wait(5.0)
        started = time.monotonic()
        reading = reader.latest(max_age_s=60.0)
        elapsed = time.monotonic() - started
        assert not finished.is_set(), "the read was meant to be hanging"
        assert elapsed < 1.0
        assert reading is not None and reading.watts == 220.0
    finally:
        bmc.process.send_signal(signal.SIGCONT)
    # Answered once it runs again: the hanging read completes (or times out) on the thread.
    assert finished.wait(10.0)
    reader.stop()
