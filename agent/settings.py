"""Agent settings: one typed object from ``JOBSIGHT_*`` env vars and an optional TOML file.

The agent runs inside researchers' jobs, so a bad value never raises: it is
warned about once and the default is used (CONTRIBUTING rule 2).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from jobsight.protocol.paths import ADMIN_TOKEN_FILE, default_data_dir

log = logging.getLogger("jobsight.agent")

DEFAULT_URL = "http://127.0.0.1:8787"


@dataclass(frozen=True)
class CollectorEndpoint:
    """The collector URL taken apart for ``http.client`` and sockets."""

    https: bool
    host: str
    port: int | None
    """``None``: the scheme's default port."""
    prefix: str
    """The URL's path without a trailing slash (``""`` at the root); API paths go under it."""


@dataclass(frozen=True)
class AgentSettings:
    url: str = DEFAULT_URL
    """Collector base URL (``JOBSIGHT_URL``)."""
    token: str | None = None
    """Bearer token (``JOBSIGHT_TOKEN``); ``None`` means look in ``token_file`` and then
    the local admin token when the collector is on loopback."""
    token_file: str | None = None
    cluster: str = "default"
    job_id: str | None = None
    """``JOBSIGHT_JOB_ID`` or ``SLURM_JOB_ID``; ``None`` means a local job id is made."""
    node: str = field(default_factory=socket.gethostname)
    spool_dir: str | None = None
    """Where unsent batches are kept; ``None`` means ``<data dir>/spool``."""
    spool_max_bytes: int = 256 * 1024 * 1024
    batch_records: int = 1000
    batch_age_s: float = 1.0
    queue_max: int = 100_000
    http_timeout_s: float = 5.0
    sample_interval_s: float = 5.0
    registration_dir: str = "/run/jobsight/jobs"
    nvml_library: str | None = None
    """Path of ``libnvidia-ml.so.1``; ``None`` lets pynvml find the system one."""
    data_dir: str = field(default_factory=default_data_dir)
    directive_poll_s: float = 3.0
    phase_report_s: float = 30.0
    """A training rank that stays this long (and three times its last step) in one phase of a step
    (waiting for its batch, forward, backward, optimizer, validation) says so, once per phase:
    what the hung rule reads to name the rank the others wait for (``agent/training/step_watch.py``)."""
    poison_tries: int = 5
    """Tries of one batch, all with the same non-transient answer (e.g. HTTP 500), before it is
    set aside; ``poison_after_s`` must have passed too (see ``agent/shipping/poison.py``)."""
    poison_after_s: float = 120.0
    """Seconds from the first such try before a batch may be set aside."""
    kineto_daemon: bool = True
    """The node daemon answers PyTorch processes' profiler requests (``KINETO_USE_DAEMON=1``,
    exported by the task prolog): on-demand profiles of jobs without our callback."""
    kineto_socket: str = "dynolog"
    """The socket name Kineto asks for (fixed in PyTorch; Dynolog's too)."""
    kineto_socket_dir: str | None = "/run/jobsight/kineto"
    """Root-owned directory of one socket directory per user, ``<dir>/<uid>/`` (0700, the user's),
    holding the daemon's socket file ``dynolog``; the task prolog exports ``<dir>/<uid>`` to the
    job as ``KINETO_IPC_SOCKET_DIR``. Kineto appends a 52-character client name to that without
    checking the 108-byte limit of a socket path, so this stays at most
    :data:`KINETO_SOCKET_DIR_MAX_BYTES`. ``None`` (in code only) means the abstract name."""
    kineto_abstract_socket: bool = False
    """Opt-in: serve the abstract name ``@dynolog`` that every process of the node can reach, as
    Dynolog does, instead of the per-user socket files (docs/profiling.md says what a site gives up
    with it)."""
    kineto_trace_dir: str = "/var/lib/jobsight/traces"
    """Node-local directory of the traces being written (root's, 0711), one 0700 directory per job,
    owned by its user."""
    kineto_trace_cap_bytes: int = 64 * 1024 * 1024
    """A trace larger than this is refused (read no further) and its request fails."""
    power_source: str = "none"
    """The node's power beside its GPUs: ``rapl``, ``ipmi``, ``redfish`` or ``none`` (docs/energy.md); the
    node daemon splits it across the node's jobs by CPU time."""
    power_idle_split: str = "cores"
    """The node's idle power: shared by the jobs' allocated cores (``cores``) or left unassigned (``none``)."""
    power_interval_s: float = 10.0
    """Seconds between two reads of a BMC (IPMI, Redfish), on their own thread; RAPL is read every tick."""
    powercap_root: str = "/sys/class/powercap"
    ipmitool: str = "ipmitool"
    ipmi_host: str | None = None
    """The BMC's address for IPMI over LAN (``lanplus``); unset: the local BMC in-band (``open``)."""
    ipmi_port: int = 623
    ipmi_user: str | None = None
    ipmi_password_file: str | None = None
    """Root-only file holding the BMC password (given to ipmitool as ``-f``, never on its command line)."""
    ipmi_sensor: str | None = None
    """A power sensor's name to read where the BMC has no DCMI power reading."""
    ipmi_interface: str = "lanplus"
    redfish_url: str | None = None
    """The BMC's base URL, ``https://…``."""
    redfish_credentials_file: str | None = None
    """Root-only file, one line ``user:password``."""
    redfish_ca_file: str | None = None
    """CA bundle that signed the BMC's certificate; unset: the system's."""
    redfish_chassis: str | None = None
    """The chassis whose power is read; unset: the first of ``/redfish/v1/Chassis``."""

    def kineto_uses_abstract_socket(self) -> bool:
        """Whether the daemon serves ``@dynolog`` rather than per-user socket files."""
        return self.kineto_abstract_socket or not self.kineto_socket_dir

    def collector_endpoint(self) -> CollectorEndpoint:
        parsed = urlparse(self.url)
        return CollectorEndpoint(
            https=parsed.scheme == "https",
            host=parsed.hostname or "127.0.0.1",
            port=parsed.port,
            prefix=parsed.path.rstrip("/"),
        )

    def resolved_spool_dir(self) -> str:
        return self.spool_dir or os.path.join(self.data_dir, "spool")

    def resolved_token(self) -> str | None:
        """The token to send, or ``None`` when none can be found (the collector will say 401)."""
        if self.token:
            return self.token
        for path in self._token_paths():
            try:
                with open(path, encoding="utf-8") as handle:
                    value = handle.read().strip()
            except OSError:
                continue
            if value:
                return value
        return None

    def _token_paths(self) -> list[str]:
        paths = [self.token_file] if self.token_file else []
        host = urlparse(self.url).hostname or ""
        if host in ("127.0.0.1", "localhost", "::1"):
            paths.append(os.path.join(self.data_dir, ADMIN_TOKEN_FILE))
        return paths


_ENV_NAMES = {
    "url": "JOBSIGHT_URL",
    "token": "JOBSIGHT_TOKEN",
    "token_file": "JOBSIGHT_TOKEN_FILE",
    "cluster": "JOBSIGHT_CLUSTER",
    "job_id": "JOBSIGHT_JOB_ID",
    "node": "JOBSIGHT_NODE",
    "spool_dir": "JOBSIGHT_SPOOL_DIR",
    "spool_max_bytes": "JOBSIGHT_SPOOL_MAX_BYTES",
    "batch_records": "JOBSIGHT_BATCH_RECORDS",
    "batch_age_s": "JOBSIGHT_BATCH_AGE_S",
    "queue_max": "JOBSIGHT_QUEUE_MAX",
    "http_timeout_s": "JOBSIGHT_HTTP_TIMEOUT_S",
    "sample_interval_s": "JOBSIGHT_SAMPLE_INTERVAL_S",
    "registration_dir": "JOBSIGHT_REGISTRATION_DIR",
    "nvml_library": "JOBSIGHT_NVML_LIBRARY",
    "data_dir": "JOBSIGHT_DATA_DIR",
    "directive_poll_s": "JOBSIGHT_DIRECTIVE_POLL_S",
    "phase_report_s": "JOBSIGHT_PHASE_REPORT_S",
    "poison_tries": "JOBSIGHT_POISON_TRIES",
    "poison_after_s": "JOBSIGHT_POISON_AFTER_S",
    "kineto_daemon": "JOBSIGHT_KINETO_DAEMON",
    "kineto_socket": "JOBSIGHT_KINETO_SOCKET",
    "kineto_socket_dir": "JOBSIGHT_KINETO_SOCKET_DIR",
    "kineto_abstract_socket": "JOBSIGHT_KINETO_ABSTRACT_SOCKET",
    "kineto_trace_dir": "JOBSIGHT_KINETO_TRACE_DIR",
    "kineto_trace_cap_bytes": "JOBSIGHT_KINETO_TRACE_CAP_BYTES",
    "power_source": "JOBSIGHT_POWER_SOURCE",
    "power_idle_split": "JOBSIGHT_POWER_IDLE_SPLIT",
    "power_interval_s": "JOBSIGHT_POWER_INTERVAL_S",
    "powercap_root": "JOBSIGHT_POWERCAP_ROOT",
    "ipmitool": "JOBSIGHT_IPMITOOL",
    "ipmi_host": "JOBSIGHT_IPMI_HOST",
    "ipmi_port": "JOBSIGHT_IPMI_PORT",
    "ipmi_user": "JOBSIGHT_IPMI_USER",
    "ipmi_password_file": "JOBSIGHT_IPMI_PASSWORD_FILE",
    "ipmi_sensor": "JOBSIGHT_IPMI_SENSOR",
    "ipmi_interface": "JOBSIGHT_IPMI_INTERFACE",
    "redfish_url": "JOBSIGHT_REDFISH_URL",
    "redfish_credentials_file": "JOBSIGHT_REDFISH_CREDENTIALS_FILE",
    "redfish_ca_file": "JOBSIGHT_REDFISH_CA_FILE",
    "redfish_chassis": "JOBSIGHT_REDFISH_CHASSIS",
}

# Integer settings with a floor: below it the setting would mean nothing (or everything).
_AT_LEAST = {"poison_tries": 1, "kineto_trace_cap_bytes": 1024, "ipmi_port": 1}

KINETO_SOCKET_DIR_MAX_BYTES = 40
"""``<dir>/<uid>/dynoconfigclient<36-character uuid>`` must fit the 108 bytes of a socket path with
its NUL: 40 + 11 (``/`` and a 10-digit uid) + 53 leaves room; the directory a job is given stays
at most 51 characters."""


def _check_kineto_socket_dir(value: str | None) -> str:
    # An empty value must not silently turn on the abstract name (a weaker boundary): that is
    # JOBSIGHT_KINETO_ABSTRACT_SOCKET's job alone.
    if value is None or not value.startswith("/") or "\0" in value:
        raise ValueError("must be an absolute directory")
    if len(value.rstrip("/").encode()) > KINETO_SOCKET_DIR_MAX_BYTES:
        raise ValueError(f"must be at most {KINETO_SOCKET_DIR_MAX_BYTES} bytes (Kineto's socket paths overflow)")
    return value.rstrip("/") or "/"


def _one_of(*choices: str) -> Callable[[str | None], str]:
    def check(value: str | None) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value

    return check


def _check_redfish_url(value: str | None) -> str:
    # Basic auth goes with every request: never over plain HTTP; the URL is in every error message,
    # so it holds no credentials; the Redfish paths are the reader's.
    parsed = urlparse(value or "")
    if parsed.scheme != "https" or not parsed.hostname or parsed.username or parsed.password \
            or parsed.path.strip("/") or parsed.query or parsed.fragment:
        raise ValueError("must be the BMC's https://host[:port], with no path and no credentials")
    return (value or "").rstrip("/")


# Settings whose converted value gets one more check.
_CHECKS: dict[str, Callable[[str | None], str]] = {
    "kineto_socket_dir": _check_kineto_socket_dir,
    "power_source": _one_of("none", "rapl", "ipmi", "redfish"),
    "power_idle_split": _one_of("cores", "none"),
    "ipmi_interface": _one_of("lanplus", "lan", "open"),
    "redfish_url": _check_redfish_url,
}


def _convert(name: str, raw: Any, default: Any) -> Any:
    if isinstance(default, bool):
        return str(raw).lower() in ("1", "true", "yes", "on")
    if isinstance(default, int):
        number = int(raw)
        floor = _AT_LEAST.get(name)
        if floor is not None and number < floor:
            raise ValueError(f"must be at least {floor}")
        return number
    if isinstance(default, float):
        value = float(raw)
        if value != value or value <= 0:
            raise ValueError("must be a positive number")
        return value
    text = str(raw) if raw != "" else None
    check = _CHECKS.get(name)
    return check(text) if check is not None else text


def _read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        log.warning("jobsight: ignoring config file %s: %s", path, exc)
        return {}
    section = data.get("agent", {})
    return section if isinstance(section, dict) else {}


def load_agent_settings(env: dict[str, str] | None = None) -> AgentSettings:
    """Build settings from a TOML file (``JOBSIGHT_CONFIG``, section ``[agent]``) and env vars.

    Env vars win over the file. A bad value is warned about and replaced by the default.
    """
    env = dict(os.environ) if env is None else env
    defaults = AgentSettings()
    values: dict[str, Any] = {}
    config = env.get("JOBSIGHT_CONFIG")
    raw: dict[str, Any] = _read_toml(config) if config else {}
    for name, var in _ENV_NAMES.items():
        if var in env:
            raw[name] = env[var]
    if "job_id" not in raw and env.get("SLURM_JOB_ID"):
        raw["job_id"] = env["SLURM_JOB_ID"]
    known = {f.name for f in dataclasses.fields(AgentSettings)}
    for name, value in raw.items():
        if name not in known:
            log.warning("jobsight: unknown agent setting %r ignored", name)
            continue
        try:
            values[name] = _convert(name, value, getattr(defaults, name))
        except (TypeError, ValueError) as exc:
            log.warning("jobsight: bad value for %s (%s); using the default", _ENV_NAMES.get(name, name), exc)
    return dataclasses.replace(defaults, **values)
