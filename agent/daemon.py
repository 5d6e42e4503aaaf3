"""``jobsight agent``: the node daemon.

Every interval it takes one NVML snapshot of every GPU on the node, attributes
each GPU to its job (:mod:`agent.attribution`), reads each registered job's host
CPU and memory (:mod:`agent.host`), and hands the records to the shipper. A GPU
that works for no job is not shipped: every record belongs to a job.

The schedule does not drift (``next += interval``); a tick that overruns skips
the ticks it missed rather than bunching them. SIGTERM or SIGINT stops sampling,
drains the shipper for up to :data:`DRAIN_TIMEOUT_S` and exits 0 (what is not sent
stays in the spool for the next start). NVML that cannot be used at start is one
line on stderr and exit code 3.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any, Final

from agent import wire
from agent.attribution import Attributor, pids_by_job
from agent.cli import CliError
from agent.host import HostSampler
from agent.nvml import NvmlSampler, NvmlUnavailable
from agent.registrations import Registration, read_registrations
from agent.settings import AgentSettings, load_agent_settings
from agent.shipper import Shipper, get_shipper
from agent.tokens import NODE_TOKEN_TTL_S, mint_node_token

log = logging.getLogger("jobsight.agent.daemon")

MIN_INTERVAL_S: Final = 0.5
DRAIN_TIMEOUT_S: Final = 5.0
SHUTDOWN_TIMEOUT_S: Final = 2.0
EXIT_NO_NVML: Final = 3
SECRET_FILE_ENV: Final = "JOBSIGHT_SECRET_FILE"
DEFAULT_SECRET_FILE: Final = "/etc/jobsight/cluster_secret"
# Re-mint when this much of the token's life is left, well before it expires.
NODE_TOKEN_RENEW_FRACTION: Final = 1 / 3


@dataclass
class TickResult:
    """What one tick did (for tests, benchmarks and the debug log)."""

    gpu_records: int = 0
    host_records: int = 0
    unattributed: int = 0
    """GPU rows that worked for no job and were not shipped."""
    nvml_ok: bool = True


class NodeDaemon:
    """The sampling loop, with every input a parameter (STYLE rule 8)."""

    def __init__(
        self,
        settings: AgentSettings,
        sampler: NvmlSampler,
        shipper: Shipper,
        *,
        interval_s: float | None = None,
        registration_dir: str | None = None,
        proc_root: str = "/proc",
        cgroup_root: str = "/sys/fs/cgroup",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.sampler = sampler
        self.shipper = shipper
        self.interval_s = max(MIN_INTERVAL_S, interval_s if interval_s is not None else settings.sample_interval_s)
        self.registration_dir = registration_dir or settings.registration_dir
        self.proc_root = proc_root
        self._clock = clock
        self._attributor = Attributor(proc_root)
        self._host = HostSampler(proc_root, cgroup_root, clock)
        self._nvml_failing = False
        self._warned_nodes: set[str] = set()

    def tick(self) -> TickResult:
        """One snapshot of every GPU and every registered job, queued for shipping."""
        result = TickResult()
        ts = wire.now_us()
        node = self.settings.node
        registrations = read_registrations(self.registration_dir)
        self._check_nodes(registrations)
        try:
            readings = self.sampler.sample()
        except NvmlUnavailable as exc:
            # The driver may be reloading (an upgrade): keep the host samples, retry next tick.
            if not self._nvml_failing:
                log.warning("jobsight agent: NVML unavailable, GPU samples paused: %s", exc)
            self._nvml_failing = True
            readings = []
            result.nvml_ok = False
        else:
            if self._nvml_failing:
                log.info("jobsight agent: NVML is back")
            self._nvml_failing = False
        for reading, jobs in self._attributor.attribute(readings, registrations):
            if not jobs:
                result.unattributed += 1
                continue
            fields = reading.to_record()
            for job in jobs:
                self.shipper.enqueue({"kind": "gpu_sample", "job": job, "ts": ts, "node": node, **fields})
                result.gpu_records += 1
        result.host_records = self._host_samples(registrations, ts, node)
        if result.unattributed:
            log.debug("jobsight agent: %d GPU row(s) with no job this tick, not shipped", result.unattributed)
        return result

    def _check_nodes(self, registrations: list[Registration]) -> None:
        for registration in registrations:
            if registration.node != self.settings.node and registration.node not in self._warned_nodes:
                self._warned_nodes.add(registration.node)
                log.warning(
                    "jobsight agent: registration of job %s names node %r but this daemon ships as %r; "
                    "set JOBSIGHT_NODE to the Slurm node name",
                    registration.job_id,
                    registration.node,
                    self.settings.node,
                )

    def _host_samples(self, registrations: list[Registration], ts: int, node: str) -> int:
        jobs = [r.job_id for r in registrations]
        self._host.forget(jobs)
        shipped = 0
        by_job: dict[str, list[int]] | None = None
        for job in jobs:
            pids: list[int] | None = None
            if self._host.find_cgroup(job) is None:
                if by_job is None:
                    by_job = pids_by_job(self.proc_root)  # one scan per tick, only when needed
                pids = by_job.get(job, [])
            reading = self._host.sample(job, pids)
            if reading is None:
                continue
            self.shipper.enqueue({"kind": "host_sample", "job": job, "ts": ts, "node": node, **reading.to_record()})
            shipped += 1
        return shipped

    def run(self, stop: threading.Event, once: bool = False, before_tick: Callable[[], None] | None = None) -> int:
        """Tick until ``stop`` is set (or once); returns the number of ticks."""
        ticks = 0
        next_at = self._clock()
        while not stop.is_set():
            if before_tick is not None:
                before_tick()
            try:
                self.tick()
            except Exception:  # boundary: one bad tick must not end the daemon
                log.exception("jobsight agent: tick failed")
            ticks += 1
            if once:
                break
            next_at += self.interval_s
            now = self._clock()
            if next_at < now:
                missed = int((now - next_at) // self.interval_s) + 1
                log.debug("jobsight agent: tick overran, skipping %d tick(s)", missed)
                next_at += missed * self.interval_s
            stop.wait(next_at - now)
        return ticks


# -- node token ---------------------------------------------------------------------


class NodeTokenSource:
    """Mints this node's ingest token from the cluster secret, when it can.

    Without a readable secret file :meth:`token` is ``None`` and the settings' token
    is used. The token is minted again when a third of its life is left.
    """

    def __init__(
        self,
        settings: AgentSettings,
        secret_file: str,
        ttl_s: int = NODE_TOKEN_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.secret_file = secret_file
        self.ttl_s = ttl_s
        self._clock = clock
        self._renew_at = 0.0
        self._current: str | None = None
        self._warned = False

    def _secret(self) -> bytes | None:
        try:
            info = os.stat(self.secret_file)
            with open(self.secret_file, "rb") as handle:
                secret = handle.read().strip()
        except OSError:
            return None
        if info.st_mode & stat.S_IRWXO and not self._warned:
            self._warned = True
            log.warning(
                "jobsight agent: the cluster secret %s is readable by every user; chmod 600 it", self.secret_file
            )
        return secret or None

    def token(self) -> str | None:
        """The current node token, minted again when due; ``None`` when none can be minted."""
        now = self._clock()
        if self._current is not None and now < self._renew_at:
            return self._current
        secret = self._secret()
        if secret is None:
            return self._current
        try:
            self._current = mint_node_token(secret, self.settings.cluster, self.settings.node, self.ttl_s)
        except Exception:  # noqa: BLE001 - boundary: a minting bug must not stop the daemon
            log.exception("jobsight agent: minting the node token failed")
            return self._current
        self._renew_at = now + self.ttl_s * (1 - NODE_TOKEN_RENEW_FRACTION)
        return self._current


def _install_token(shipper: Shipper, token: str) -> None:
    """Give the shipper a re-minted token for its next request."""
    shipper.set_token(token)


# -- CLI ----------------------------------------------------------------------------


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
    settings = load_agent_settings()
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


def _serve(settings: AgentSettings, once: bool, stop: threading.Event) -> int:
    sampler = NvmlSampler(settings.nvml_library)
    try:
        sampler.open()
    except NvmlUnavailable as exc:
        raise CliError(str(exc), EXIT_NO_NVML) from None

    tokens = NodeTokenSource(settings, os.environ.get(SECRET_FILE_ENV) or DEFAULT_SECRET_FILE)
    minting = not settings.token  # an explicit JOBSIGHT_TOKEN wins over minting
    if minting:
        minted = tokens.token()
        if minted is not None:
            settings = dataclasses.replace(settings, token=minted)
    shipper = get_shipper(settings)
    shipper.start()  # replay what an earlier run left in the spool
    current_token = settings.token

    def renew() -> None:
        nonlocal current_token
        fresh = tokens.token()
        if fresh is not None and fresh != current_token:
            current_token = fresh
            _install_token(shipper, fresh)

    daemon = NodeDaemon(settings, sampler, shipper)
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
        drained = shipper.flush(DRAIN_TIMEOUT_S)
        shipper.shutdown(SHUTDOWN_TIMEOUT_S)
        sampler.close()
    if not drained:
        log.warning("jobsight agent: not everything was sent before exit; the rest waits in the spool")
    return 0
