"""``jobsight slurm prolog|epilog|task-prolog``: what the ``slurm/`` wrappers run.

Best-effort by design (STYLE rule 13): every network call has a timeout of at most
:data:`NET_TIMEOUT_S`, every step is tried even when an earlier one failed, problems go
to syslog (or to ``JOBSIGHT_HOOK_LOG`` when set) and the exit status is always 0, so
jobsight never drains a node or fails a job.

* **prolog** (root, every node of the allocation): reads the job from Slurm's
  environment (see ``tests/slurm/NOTES.md``), mints the job token (cluster secret,
  valid for the time limit plus ``JOBSIGHT_TOKEN_GRACE_S``), writes the token file
  (``<JOBSIGHT_TOKEN_DIR>/<job>.token``, owned by the job's uid, mode 0400) and the
  registration (:mod:`agent.registrations`), and posts ``job_started``.
* **task prolog** (the job's user, before every task): prints one ``export NAME=value``
  line each for the collector URL, cluster, job id and token. No network.
* **epilog** (root): posts ``job_ended`` with the job's exit code, removes the
  registration and the token file, and replays what earlier hooks spooled.

Root hooks post with this node's token (minted from the same secret as the node
daemon's), so a spooled batch can be replayed by the daemon or a later hook. When
the collector does not answer in time, the batch goes to the disk spool (the one the
node daemon replays: ``JOBSIGHT_SPOOL_DIR``, else ``<JOBSIGHT_DATA_DIR>/spool``,
else ``/var/lib/jobsight/spool`` for root) and is fsynced before the hook exits.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import socket
import subprocess
import sys
import syslog
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlparse

from agent import wire
from agent.settings import AgentSettings, load_agent_settings

log = logging.getLogger("jobsight.slurm")

HOOKS: Final = ("prolog", "epilog", "task-prolog")
NET_TIMEOUT_S: Final = 1.0
REPLAY_BUDGET_S: Final = 1.0
DEFAULT_SECRET_FILE: Final = "/etc/jobsight/cluster_secret"
DEFAULT_TOKEN_DIR: Final = "/run/jobsight/tokens"
ROOT_DATA_DIR: Final = "/var/lib/jobsight"
DEFAULT_GRACE_S: Final = 3600
# A job without a known time limit (UNLIMITED, or scontrol unavailable) gets this.
DEFAULT_TOKEN_TTL_S: Final = 30 * 86400
SCONTROL: Final = "/usr/bin/scontrol"
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_./:@%+,=-]+$")
_SAFE_JOB = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$")


@dataclass(frozen=True)
class HookSettings:
    """What the hooks need beyond :class:`AgentSettings`, from ``JOBSIGHT_*`` env vars
    (the wrappers export ``/etc/jobsight/hooks.env``)."""

    secret_file: str = DEFAULT_SECRET_FILE
    token_dir: str = DEFAULT_TOKEN_DIR
    grace_s: int = DEFAULT_GRACE_S
    log_file: str | None = None
    """``None``: problems go to syslog (facility daemon, or user for the task prolog)."""
    scontrol: str = SCONTROL


def load_hook_settings(env: dict[str, str]) -> HookSettings:
    grace = DEFAULT_GRACE_S
    raw = env.get("JOBSIGHT_TOKEN_GRACE_S")
    if raw:
        try:
            grace = max(0, int(raw))
        except ValueError:
            log.warning("bad JOBSIGHT_TOKEN_GRACE_S %r; using %d", raw, DEFAULT_GRACE_S)
    return HookSettings(
        secret_file=env.get("JOBSIGHT_SECRET_FILE") or DEFAULT_SECRET_FILE,
        token_dir=env.get("JOBSIGHT_TOKEN_DIR") or DEFAULT_TOKEN_DIR,
        grace_s=grace,
        log_file=env.get("JOBSIGHT_HOOK_LOG") or None,
        scontrol=env.get("JOBSIGHT_SCONTROL") or SCONTROL,
    )


# -- logging -------------------------------------------------------------------------


class _SyslogHandler(logging.Handler):
    """Through the ``syslog`` module: no socket to manage, silently nothing without a daemon."""

    def __init__(self, ident: str, facility: int):
        super().__init__()
        syslog.openlog(ident, syslog.LOG_PID, facility)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            priority = syslog.LOG_ERR if record.levelno >= logging.ERROR else (
                syslog.LOG_WARNING if record.levelno >= logging.WARNING else syslog.LOG_INFO)
            syslog.syslog(priority, self.format(record))
        except Exception:  # noqa: BLE001 - boundary: logging must never fail a hook
            pass


def _setup_logging(hook: str, hook_settings: HookSettings) -> None:
    handler: logging.Handler
    if hook_settings.log_file:
        try:
            handler = logging.FileHandler(hook_settings.log_file, encoding="utf-8")
            fmt = f"%(asctime)s jobsight-{hook}[%(process)d] %(levelname)s %(message)s"
            handler.setFormatter(logging.Formatter(fmt))
        except OSError:
            handler = _SyslogHandler(f"jobsight-{hook}", syslog.LOG_DAEMON)
    else:
        facility = syslog.LOG_USER if hook == "task-prolog" else syslog.LOG_DAEMON
        handler = _SyslogHandler(f"jobsight-{hook}", facility)
    root = logging.getLogger("jobsight")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False


# -- the job, from Slurm's environment -----------------------------------------------


def expand_hostlist(expression: str) -> list[str]:
    """Slurm's ``gpu[01-03,07],login1`` → ``["gpu01", "gpu02", "gpu03", "gpu07", "login1"]``.

    Handles one bracket group per name (what Slurm prints for flat node names).
    """
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", expression):
        match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not match:
            if part:
                names.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            low, _, high = item.partition("-")
            if high and low.isdigit() and high.isdigit():
                names.extend(f"{prefix}{n:0{len(low)}d}{suffix}" for n in range(int(low), int(high) + 1))
            elif item:
                names.append(f"{prefix}{item}{suffix}")
    return names


def parse_gpus(value: str | None) -> list[int]:
    """``"0,1"`` → ``[0, 1]``; entries that are not indices (UUIDs, MIG names) are left out."""
    if not value:
        return []
    return list(dict.fromkeys(int(v) for v in value.split(",") if v.strip().isdigit()))


def parse_time_limit(text: str) -> int | None:
    """Slurm's ``[days-]hours:minutes:seconds`` / ``minutes:seconds`` / ``minutes`` → seconds;
    ``None`` for ``UNLIMITED``, ``Partition_Limit`` or anything unreadable."""
    text = text.strip()
    days = 0
    if "-" in text:
        head, _, text = text.partition("-")
        if not head.isdigit():
            return None
        days = int(head)
    parts = text.split(":")
    if not parts or not all(p.isdigit() for p in parts) or len(parts) > 3:
        return None
    numbers = [int(p) for p in parts]
    if len(numbers) == 1:
        seconds = numbers[0] * (3600 if days else 60)
    elif len(numbers) == 2:
        seconds = numbers[0] * 60 + numbers[1] if days == 0 else numbers[0] * 3600 + numbers[1] * 60
    else:
        seconds = numbers[0] * 3600 + numbers[1] * 60 + numbers[2]
    return days * 86400 + seconds


def scontrol_job(env: dict[str, str], job: str, scontrol: str) -> dict[str, str]:
    """What the prolog's environment lacks (time limit, job name), from one
    ``scontrol show job -o`` with a 1 s timeout; ``{}`` when it cannot be run.

    ``SLURM_JOB_START_TIME``/``SLURM_JOB_END_TIME`` (newer Slurm) give the time limit
    without it, but the job name still needs it (22.05 gives the prolog no ``SLURM_JOB_NAME``).
    """
    if not os.access(scontrol, os.X_OK):
        return {}
    try:
        out = subprocess.run([scontrol, "show", "job", "-o", job], capture_output=True, text=True,
                             timeout=NET_TIMEOUT_S, check=False, env={"PATH": "/usr/bin:/bin"}).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("job %s: scontrol show job failed (%s)", job, exc)
        return {}
    fields = {}
    limit = re.search(r"\bTimeLimit=(\S+)", out)
    if limit:
        fields["time_limit"] = limit.group(1)
    # JobName may hold spaces; scontrol prints UserId= right after it.
    name = re.search(r"\bJobName=(.*?) UserId=", out) or re.search(r"\bJobName=(\S+)", out)
    if name and name.group(1):
        fields["name"] = name.group(1)
    return fields


def job_time_limit(env: dict[str, str], fields: dict[str, str]) -> int | None:
    """The job's time limit in seconds; ``None`` when unknown or unlimited."""
    start, end = env.get("SLURM_JOB_START_TIME", ""), env.get("SLURM_JOB_END_TIME", "")
    if start.isdigit() and end.isdigit() and int(end) > int(start):
        return int(end) - int(start)
    return parse_time_limit(fields["time_limit"]) if "time_limit" in fields else None


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.strip().lstrip("-").isdigit() else None


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    node: str
    user: str | None
    uid: int | None
    gid: int | None
    account: str | None
    partition: str | None
    name: str | None
    nodes: list[str]
    node_count: int | None
    gpus: list[int]
    restart_count: int


def job_from_env(env: dict[str, str], settings: AgentSettings) -> SlurmJob:
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    if not _SAFE_JOB.match(job):
        raise ValueError(f"SLURM_JOB_ID {job!r} is missing or not a job id")
    node = env.get("JOBSIGHT_NODE") or env.get("SLURMD_NODENAME") or settings.node
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    return SlurmJob(
        job_id=job,
        node=node,
        user=env.get("SLURM_JOB_USER") or None,
        uid=_int(env.get("SLURM_JOB_UID") or env.get("SLURM_UID")),
        gid=_int(env.get("SLURM_JOB_GID")),
        account=env.get("SLURM_JOB_ACCOUNT") or None,
        partition=env.get("SLURM_JOB_PARTITION") or None,
        name=env.get("SLURM_JOB_NAME") or None,
        nodes=expand_hostlist(nodelist) or [node],
        node_count=_int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")),
        # SLURM_JOB_GPUS holds global GRES indices; CUDA_VISIBLE_DEVICES is renumbered
        # under ConstrainDevices, so it is only the fallback (see tests/slurm/NOTES.md).
        gpus=parse_gpus(env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES")),
        restart_count=_int(env.get("SLURM_JOB_RESTART_COUNT")) or 0,
    )


def exit_code_from_env(env: dict[str, str]) -> int | None:
    """The batch script's exit status: ``SLURM_JOB_EXIT_CODE2`` (``exit:signal``), else the raw
    wait status in ``SLURM_JOB_EXIT_CODE``; a signal reads as ``128 + signal``."""
    code2 = env.get("SLURM_JOB_EXIT_CODE2", "")
    match = re.fullmatch(r"(\d+):(\d+)", code2.strip())
    if match:
        code, signal = int(match.group(1)), int(match.group(2))
        return 128 + signal if signal else code
    raw = _int(env.get("SLURM_JOB_EXIT_CODE"))
    if raw is None:
        return None
    return 128 + (raw & 0x7F) if raw & 0x7F else (raw >> 8) & 0xFF


# -- tokens and files ----------------------------------------------------------------


def read_secret(path: str) -> bytes | None:
    """The cluster secret, or ``None`` (logged) when it cannot be read by this process."""
    try:
        with open(path, "rb") as handle:
            secret = handle.read().strip()
    except OSError as exc:
        log.warning("cannot read the cluster secret %s: %s", path, exc.strerror or exc)
        return None
    if not secret:
        log.warning("the cluster secret %s is empty", path)
        return None
    return secret


def token_path(token_dir: str, job: str) -> str:
    return os.path.join(token_dir, f"{job}.token")


def write_token_file(token_dir: str, job: str, token: str, uid: int | None, gid: int | None) -> str:
    """Write the job's token, owned by the job's uid, mode 0400, atomically; returns the path.

    The directory is made 0711: users can open their own file by name but not list others.
    """
    os.makedirs(token_dir, mode=0o711, exist_ok=True)
    path = token_path(token_dir, job)
    fd, tmp = tempfile.mkstemp(dir=token_dir, prefix=f".{job}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o400)
        if uid is not None and os.geteuid() == 0:
            os.fchown(fd, uid, gid if gid is not None else -1)
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(token + "\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


# -- sending, spooling, replaying ----------------------------------------------------


def spool_dir(settings: AgentSettings, env: dict[str, str]) -> str:
    """The node daemon's spool, so that it replays what a hook could not send."""
    if settings.spool_dir or env.get("JOBSIGHT_DATA_DIR") or os.geteuid() != 0:
        return settings.resolved_spool_dir()
    return os.path.join(ROOT_DATA_DIR, "spool")


class HookSender:
    """One short-lived sender: a POST with a ≤ 1 s timeout, else an fsynced spool append."""

    def __init__(self, settings: AgentSettings, token: str | None, spool: str, deadline: float):
        self.settings = settings
        self.token = token
        self.spool_path = spool
        self.deadline = deadline
        parsed = urlparse(settings.url)
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname or "127.0.0.1"
        self._port = parsed.port
        self._path = parsed.path.rstrip("/") + "/v1/ingest"
        self.reachable: bool | None = None
        """``None``: not tried yet; ``False``: the collector did not answer (or said 5xx)."""

    def _post(self, body: bytes) -> tuple[int, str]:
        """``(status, detail)``; status 0 for a network error or timeout.

        Plain HTTP/1.1 over a socket rather than ``http.client``: its imports (email,
        ssl) are a fifth of a hook's run time, and a hook sends one request.
        """
        timeout = max(0.05, min(NET_TIMEOUT_S, self.settings.http_timeout_s, self.deadline - time.monotonic()))
        port = self._port or (443 if self._https else 80)
        head = [f"POST {self._path} HTTP/1.1", f"Host: {self._host}:{port}", "Content-Type: application/json",
                "Content-Encoding: gzip", f"Content-Length: {len(body)}", "Connection: close"]
        if self.token:
            head.append(f"Authorization: Bearer {self.token}")
        try:
            with socket.create_connection((self._host, port), timeout=timeout) as raw:
                sock = raw
                if self._https:
                    import ssl

                    sock = ssl.create_default_context().wrap_socket(raw, server_hostname=self._host)
                sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
                answer = b""
                while len(answer) < 65536:
                    chunk = sock.recv(8192)
                    if not chunk:
                        break
                    answer += chunk
        except OSError as exc:
            return 0, f"{type(exc).__name__}: {exc}"
        status_line, _, rest = answer.partition(b"\r\n")
        parts = status_line.split()
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
            return 0, "not an HTTP answer"
        return int(parts[1]), rest.partition(b"\r\n\r\n")[2][:2000].decode("utf-8", "replace")

    def send(self, source: str, records: list[dict[str, Any]]) -> str:
        """Post one batch; returns ``sent``, ``refused`` (4xx, logged) or ``spooled``/``lost``."""
        body = wire.encode_batch(source, 0, records, self.settings.cluster)
        status, detail = self._post(body) if time.monotonic() < self.deadline else (0, "no time left")
        if status == 200:
            self.reachable = True
            return "sent"
        if 400 <= status < 500 and status not in (408, 429):
            self.reachable = True
            log.warning("the collector refused %s (HTTP %d): %s", records[0]["kind"], status, detail[:500])
            return "refused"
        self.reachable = False
        log.warning("collector %s unavailable (%s); spooling %s", self.settings.url, detail or f"HTTP {status}",
                    records[0]["kind"])
        return "spooled" if self._spool(source, len(records), body) else "lost"

    def _spool(self, source: str, count: int, body: bytes) -> bool:
        from agent.spool import Spool

        try:
            spool = Spool(self.spool_path, self.settings.spool_max_bytes)
        except OSError as exc:
            log.error("cannot open the spool %s: %s; record lost", self.spool_path, exc)
            return False
        try:
            ok = spool.append(source, 0, count, body)
        finally:
            spool.close()  # fsyncs and releases the segment for the daemon or the next hook
        if not ok:
            log.error("spool %s full or unwritable; record lost", self.spool_path)
        return ok

    def replay(self) -> int:
        """Send batches earlier hooks (or a dead daemon) left in the spool, oldest first, until
        the deadline; returns how many were acknowledged. Skipped when the collector is away."""
        if self.reachable is False or not os.path.isdir(self.spool_path):
            return 0
        from agent.spool import Spool

        try:
            spool = Spool(self.spool_path, self.settings.spool_max_bytes)
        except OSError:
            return 0
        sent = 0
        try:
            spool.adopt()  # only segments nobody alive holds: never the daemon's own
            while time.monotonic() < self.deadline:
                batch = spool.peek()
                if batch is None:
                    break
                status, detail = self._post(batch.body)
                if status == 200:
                    spool.ack()
                    sent += 1
                elif 400 <= status < 500 and status not in (408, 429):
                    log.warning("the collector refused spooled batch %s/%d (HTTP %d): %s",
                                batch.source, batch.seq, status, detail[:500])
                    spool.reject(batch, status, detail)
                else:
                    break
        finally:
            spool.close()
        return sent


def _source(settings: AgentSettings, hook: str, job: SlurmJob) -> str:
    # One fixed source per hook and job run: a re-run hook (or a retried post) is a duplicate.
    return f"{settings.cluster}/{job.node}:slurm-{hook}:{job.job_id}.{job.restart_count}"


def _node_token(settings: AgentSettings, secret: bytes | None, node: str) -> str | None:
    from agent.tokens import mint_node_token

    if secret is None:
        return settings.resolved_token()
    return mint_node_token(secret, settings.cluster, node, ttl_s=3600)


# -- the hooks -----------------------------------------------------------------------


def run_prolog(env: dict[str, str], settings: AgentSettings, hooks: HookSettings) -> None:
    from agent.tokens import mint_job_token

    deadline = time.monotonic() + 2 * NET_TIMEOUT_S
    started_us = wire.now_us()
    job = job_from_env(env, settings)
    fields = scontrol_job(env, job.job_id, hooks.scontrol)
    time_limit = job_time_limit(env, fields)
    name = job.name or fields.get("name")
    secret = read_secret(hooks.secret_file)

    token_file: str | None = None
    if secret is not None:
        ttl = (time_limit + hooks.grace_s) if time_limit else DEFAULT_TOKEN_TTL_S
        try:
            token = mint_job_token(secret, settings.cluster, job.job_id, ttl, uid=job.uid)
            token_file = write_token_file(hooks.token_dir, job.job_id, token, job.uid, job.gid)
        except (OSError, ValueError) as exc:
            log.error("job %s: cannot write the token file in %s: %s", job.job_id, hooks.token_dir, exc)

    try:
        from agent.registrations import Registration, write_registration

        write_registration(settings.registration_dir, Registration(
            cluster=settings.cluster, job_id=job.job_id, node=job.node, started_us=started_us,
            gpus=tuple(job.gpus), user=job.user, uid=job.uid, account=job.account, partition=job.partition,
            name=name, nodes=tuple(job.nodes), node_count=job.node_count, time_limit_s=time_limit,
            token_file=token_file,
        ))
    except (OSError, ValueError, ImportError) as exc:
        log.error("job %s: cannot write the registration in %s: %s", job.job_id, settings.registration_dir, exc)

    record = {
        "kind": "job_started", "job": job.job_id, "ts": started_us, "node": job.node, "user": job.user,
        "uid": job.uid, "account": job.account, "partition": job.partition, "name": name,
        "nodes": job.nodes, "node_count": job.node_count, "gpus": [str(g) for g in job.gpus],
        "time_limit_s": time_limit,
    }
    sender = HookSender(settings, _node_token(settings, secret, job.node), spool_dir(settings, env), deadline)
    sender.send(_source(settings, "prolog", job), [{k: v for k, v in record.items() if v is not None}])
    sender.replay()


def run_epilog(env: dict[str, str], settings: AgentSettings, hooks: HookSettings) -> None:
    deadline = time.monotonic() + 2 * NET_TIMEOUT_S
    job = job_from_env(env, settings)
    secret = read_secret(hooks.secret_file)
    record: dict[str, Any] = {"kind": "job_ended", "job": job.job_id, "ts": wire.now_us(), "node": job.node}
    exit_code = exit_code_from_env(env)
    if exit_code is not None:
        record["exit_code"] = exit_code
    sender = HookSender(settings, _node_token(settings, secret, job.node), spool_dir(settings, env), deadline)
    sender.send(_source(settings, "epilog", job), [record])
    try:
        from agent.registrations import remove_registration

        remove_registration(settings.registration_dir, job.job_id)
    except (OSError, ValueError, ImportError) as exc:
        log.error("job %s: cannot remove the registration: %s", job.job_id, exc)
    try:
        os.unlink(token_path(hooks.token_dir, job.job_id))
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.error("job %s: cannot remove the token file: %s", job.job_id, exc)
    sender.replay()


def task_prolog_lines(env: dict[str, str], settings: AgentSettings, hooks: HookSettings) -> list[str]:
    """The ``export`` lines, one variable each (Slurm reads one per line). Values that
    would need quoting are left out rather than risk a broken environment."""
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    if not _SAFE_JOB.match(job):
        raise ValueError(f"SLURM_JOB_ID {job!r} is missing or not a job id")
    values = {"JOBSIGHT_URL": settings.url, "JOBSIGHT_CLUSTER": settings.cluster, "JOBSIGHT_JOB_ID": job}
    try:
        with open(token_path(hooks.token_dir, job), encoding="ascii") as handle:
            values["JOBSIGHT_TOKEN"] = handle.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("job %s: no token for the job (%s)", job, getattr(exc, "strerror", None) or exc)
    lines = []
    for name, value in values.items():
        if value and _SAFE_VALUE.match(value):
            lines.append(f"export {name}={value}")
        elif value:
            log.warning("job %s: %s has characters a task prolog cannot export; left out", job, name)
    return lines


# -- CLI -----------------------------------------------------------------------------


def configure_parser(name: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("hook", choices=HOOKS, help="which Slurm hook is running")


def run_hook(hook: str, env: dict[str, str] | None = None) -> int:
    """Run one hook; always returns 0 (problems are logged)."""
    env = dict(os.environ) if env is None else env
    try:
        hooks = load_hook_settings(env)
        _setup_logging(hook, hooks)
        settings = load_agent_settings(env)
        if hook == "prolog":
            run_prolog(env, settings, hooks)
        elif hook == "epilog":
            run_epilog(env, settings, hooks)
        else:
            lines = task_prolog_lines(env, settings, hooks)
            sys.stdout.write("".join(line + "\n" for line in lines))
            sys.stdout.flush()
    except Exception as exc:  # boundary: a hook never fails the job or drains the node
        log.exception("job %s: %s failed: %s", env.get("SLURM_JOB_ID", "?"), hook, exc)
    return 0


def run(name: str, args: argparse.Namespace) -> int:
    return run_hook(args.hook)
