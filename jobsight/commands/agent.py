"""``jobsight agent``: start the node daemon, stop it cleanly on SIGTERM or SIGINT.

The daemon batches for :data:`DAEMON_BATCH_AGE_S` unless ``JOBSIGHT_BATCH_AGE_S`` (or
``batch_age_s`` in the config file) says otherwise; training processes keep the agent's 1 s.
Stopping drains the shipper for up to :data:`DRAIN_TIMEOUT_S` and exits 0 (what is not
sent stays in the spool for the next start). NVML that cannot be used at start is one
line on stderr and exit code :data:`EXIT_NO_NVML`. The sampling loop itself is
:mod:`jobsight.agent.node.daemon`.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import threading
import tomllib
from collections.abc import Mapping
from types import FrameType
from typing import Any, Final

from jobsight.agent.node.daemon import MIN_INTERVAL_S, NodeDaemon
from jobsight.agent.node.gpu.nvml import NvmlUnavailable
from jobsight.agent.node.gpu.sampler import NvmlSampler
from jobsight.agent.node.kineto.heartbeat import write_status
from jobsight.agent.node.kineto.service import KinetoService
from jobsight.agent.node.power.sources import build_node_energy
from jobsight.agent.settings import AgentSettings, load_agent_settings
from jobsight.agent.shipping.shipper import Shipper, get_shipper
from jobsight.commands.cli_error import CliError
from jobsight.protocol.tokens import DEFAULT_SECRET_FILE, NodeTokenSource

log = logging.getLogger("jobsight.agent.daemon")

DRAIN_TIMEOUT_S: Final = 5.0
SHUTDOWN_TIMEOUT_S: Final = 2.0
EXIT_NO_NVML: Final = 3
SECRET_FILE_ENV: Final = "JOBSIGHT_SECRET_FILE"
BATCH_AGE_ENV: Final = "JOBSIGHT_BATCH_AGE_S"
DAEMON_BATCH_AGE_S: Final = 10.0
"""The node daemon's batch age. At 1 s (the agent's default, right for a training process's
few records) a node sends one request per second whatever it samples: 2,000 nodes at 1 Hz are
2,000 requests/s of 8 samples each, and the collector's cost is per request far more than per
row (measured with bench/cluster.py: the same request rate with twice the samples cost the
same CPU). 10 s sends one request of 80 GPU samples per node instead, a tenth of the
requests: 2,000 nodes make 200 requests/s. A sample reaches the database at most ~10 s after
it is taken, as often as the dashboard's live refresh redraws (10 s), and a SIGKILLed daemon
loses at most those 10 s. Prometheus-based tools (jobstats) scrape every 30 s."""


def configure_parser(name: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--interval",
        metavar="S",
        help=f"seconds between samples (default JOBSIGHT_SAMPLE_INTERVAL_S or 5; at least {MIN_INTERVAL_S})",
    )
    parser.add_argument("--once", action="store_true", help="take one sample, ship it and exit")
    parser.add_argument("--registration-dir", metavar="D", help="job registrations (default /run/jobsight/jobs)")
    parser.add_argument("--nvml-library", metavar="PATH", help="libnvidia-ml.so.1 to load (default: the system one)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every tick (debug level)")


def _parse_interval(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise CliError(f"--interval: expected a number of seconds, got {raw!r}") from None
    if not value >= MIN_INTERVAL_S or value == float("inf"):
        raise CliError(f"--interval: must be at least {MIN_INTERVAL_S} seconds, got {raw!r}")
    return value


def run(name: str, args: argparse.Namespace) -> int:
    interval = _parse_interval(args.interval)
    if args.registration_dir is not None and not args.registration_dir.strip():
        raise CliError("--registration-dir: expected a directory")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    settings = daemon_settings(load_agent_settings(), os.environ)
    changes: dict[str, Any] = {}
    if interval is not None:
        changes["sample_interval_s"] = interval
    if args.registration_dir:
        changes["registration_dir"] = args.registration_dir
    if args.nvml_library:
        changes["nvml_library"] = args.nvml_library
    settings = dataclasses.replace(settings, **changes)

    # From here on a SIGTERM (systemd stopping us mid start-up) ends the loop cleanly.
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _serve(settings, args.once, stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _config_batch_age(env: Mapping[str, str]) -> object:
    """``batch_age_s`` of the config file's ``[agent]`` table, ``None`` when absent or unreadable
    (load_agent_settings has warned about an unreadable file already)."""
    path = env.get("JOBSIGHT_CONFIG")
    if not path:
        return None
    try:
        with open(path, "rb") as handle:
            section = tomllib.load(handle).get("agent", {})
    except (OSError, tomllib.TOMLDecodeError):
        return None
    return section.get("batch_age_s") if isinstance(section, dict) else None


def _accepted(raw: object) -> bool:
    """Whether load_agent_settings takes ``raw`` as a batch age (a positive number)."""
    if not isinstance(raw, str | int | float):
        return False
    try:
        return float(raw) > 0
    except ValueError:
        return False


def daemon_settings(settings: AgentSettings, env: Mapping[str, str]) -> AgentSettings:
    """``settings`` with the daemon's batch age, unless the administrator chose one.

    A value that was refused (and warned about) counts as not chosen: the daemon's default applies.
    """
    raw: object = env.get(BATCH_AGE_ENV)
    if raw is None:
        raw = _config_batch_age(env)
    if _accepted(raw):
        return settings
    return dataclasses.replace(settings, batch_age_s=DAEMON_BATCH_AGE_S)


def _node_token(tokens: NodeTokenSource) -> str | None:
    try:
        return tokens.token()
    except Exception:  # noqa: BLE001 - boundary: a minting bug must not stop the daemon
        log.exception("jobsight agent: minting the node token failed")
        return None


def _start_kineto(settings: AgentSettings, shipper: Shipper, once: bool) -> KinetoService | None:
    """The PyTorch profiler's endpoint on this node (``None``: off, or stepped aside for a
    Dynolog that holds the socket); its status is logged and written beside the registrations."""
    if once or not settings.kineto_daemon:
        return None
    service = KinetoService(settings, shipper)
    started = service.start()
    write_status(settings, {"kineto": {"serving": service.status.serving, "message": service.status.message}})
    return service if started else None


def _serve(settings: AgentSettings, once: bool, stop: threading.Event) -> int:
    sampler = NvmlSampler(settings.nvml_library, events=True)  # the daemon ships the GPUs' Xid errors
    try:
        sampler.open()
    except NvmlUnavailable as exc:
        raise CliError(str(exc), EXIT_NO_NVML) from None

    tokens = NodeTokenSource(os.environ.get(SECRET_FILE_ENV) or DEFAULT_SECRET_FILE, settings.cluster, settings.node)
    minting = not settings.token  # an explicit JOBSIGHT_TOKEN wins over minting
    if minting:
        minted = _node_token(tokens)
        if minted is not None:
            settings = dataclasses.replace(settings, token=minted)
    shipper = get_shipper(settings)
    shipper.start()  # replay what an earlier run left in the spool
    current_token = settings.token

    kineto = _start_kineto(settings, shipper, once)

    def renew() -> None:
        nonlocal current_token
        fresh = _node_token(tokens)
        if fresh is not None and fresh != current_token:
            current_token = fresh
            shipper.set_token(fresh)
            if kineto is not None:
                kineto.client.set_token(fresh)

    daemon = NodeDaemon(settings, sampler, shipper, energy=build_node_energy(settings))
    log.info(
        "jobsight agent: node %s, sampling every %.3g s, shipping to %s, registrations in %s",
        settings.node,
        daemon.interval_s,
        settings.url,
        daemon.registration_dir,
    )
    try:
        daemon.run(stop, once=once, before_tick=renew if minting else None)
    finally:
        if kineto is not None:
            kineto.stop()
        daemon.close()
        drained = shipper.flush(DRAIN_TIMEOUT_S)
        shipper.shutdown(SHUTDOWN_TIMEOUT_S)
        sampler.close()
    if not drained:
        log.warning("jobsight agent: not everything was sent before exit; the rest waits in the spool")
    return 0
