"""``jobsight slurm prolog|epilog|task-prolog``: what the ``slurm/`` wrappers run.

Best-effort by design (CONTRIBUTING rule 13): every network call has a timeout of at most
:data:`NET_TIMEOUT_S`, every step is tried even when an earlier one failed, problems go
to syslog (or to ``JOBSIGHT_HOOK_LOG`` when set) and the exit status is always 0, so
jobsight never drains a node or fails a job.

* **prolog** (root, every node of the allocation): reads the job from Slurm's
  environment (see ``tests/slurm/NOTES.md``), mints the job token (cluster secret,
  valid for the time limit plus ``JOBSIGHT_TOKEN_GRACE_S``), writes the token file
  (``<JOBSIGHT_TOKEN_DIR>/<job>.token``, owned by the job's uid, mode 0400) and the
  registration (:mod:`jobsight.agent.node.registrations`, with the run's SLUID where Slurm gives
  ``SLURM_JOB_SLUID``, 26.05 and later), and posts ``job_started`` (with that ``sluid`` too).
* **task prolog** (the job's user, before every task): prints one ``export NAME=value``
  line each for the collector URL, cluster, job id, Slurm's node name (``JOBSIGHT_NODE``: what the
  job's processes record as their node, so that ranks map to the node daemon's GPUs whatever the
  host name says) and token. No network.
* **epilog** (root): posts ``job_ended`` with the job's end state as Slurm names it and its exit
  code (the environment, and one ``squeue --json`` bounded like a network call:
  :mod:`jobsight.agent.slurm.end_state`), removes the registration and the token file, and replays
  what earlier hooks spooled.

Root hooks post with this node's token (minted from the same secret as the node
daemon's), so a spooled batch can be replayed by the daemon or a later hook. When
the collector does not answer in time, the batch goes to the disk spool (the one the
node daemon replays: ``JOBSIGHT_SPOOL_DIR``, else ``<JOBSIGHT_DATA_DIR>/spool``,
else ``/var/lib/jobsight/spool`` for root) and is fsynced before the hook exits.

Slurm's commands (``squeue``) run with slurmd's ``SLURM_CONF`` (:func:`jobsight.agent.slurm.squeue.slurm_env`)
and are found as :func:`jobsight.agent.slurm.squeue.find_squeue` says.

Reading the job from the environment is :mod:`jobsight.agent.slurm.job`, sending and spooling
:mod:`jobsight.agent.slurm.sender`, the syslog set-up :mod:`jobsight.agent.slurm.hook_log`.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Final

from jobsight.agent.atomic_files import write_atomically
from jobsight.agent.settings import AgentSettings, load_agent_settings
from jobsight.agent.slurm.end_state import end_state
from jobsight.agent.slurm.hook_log import setup_hook_logging
from jobsight.agent.slurm.job import (
    SlurmJob,
    exit_code_from_env,
    job_from_env,
    job_time_limit,
    node_name_from_env,
    sluid_from_env,
    with_slurm_ids,
)
from jobsight.agent.slurm.sender import NET_TIMEOUT_S, HookSender, spool_dir
from jobsight.agent.slurm.squeue import SQUEUE, ask_squeue, find_squeue
from jobsight.protocol import wire
from jobsight.protocol.json_safe import clip
from jobsight.protocol.slurm_ids import job_id_from_env, slurm_job_id
from jobsight.protocol.tokens import DEFAULT_SECRET_FILE, mint_job_token, mint_node_token, read_cluster_secret

log = logging.getLogger("jobsight.slurm")

HOOKS: Final = ("prolog", "epilog", "task-prolog")
REPLAY_BUDGET_S: Final = 1.0
DEFAULT_TOKEN_DIR: Final = "/run/jobsight/tokens"
DEFAULT_GRACE_S: Final = 3600
# A job without a known time limit (UNLIMITED, or squeue unavailable) gets this.
DEFAULT_TOKEN_TTL_S: Final = 30 * 86400
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_./:@%+,=-]+$")


@dataclass(frozen=True)
class HookSettings:
    """What the hooks need beyond :class:`AgentSettings`, from ``JOBSIGHT_*`` env vars
    (the wrappers export ``/etc/jobsight/hooks.env``, then the ``hooks.env`` beside themselves, whose
    lines win)."""

    secret_file: str = DEFAULT_SECRET_FILE
    token_dir: str = DEFAULT_TOKEN_DIR
    grace_s: int = DEFAULT_GRACE_S
    log_file: str | None = None
    """``None``: problems go to syslog (facility daemon, or user for the task prolog)."""
    squeue: str = SQUEUE
    """Slurm's ``squeue``, asked ``--json`` for what the environment lacks: ``JOBSIGHT_SQUEUE``, else the
    one beside slurmd's ``SLURM_CONF`` (:func:`jobsight.agent.slurm.squeue.find_squeue`)."""


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
        squeue=find_squeue(env),
    )


# -- tokens and files ----------------------------------------------------------------


def read_secret(path: str) -> bytes | None:
    """The cluster secret, or ``None`` (logged) when it cannot be read by this process."""
    try:
        return read_cluster_secret(path)
    except OSError as exc:
        log.warning("cannot read the cluster secret %s: %s", path, exc.strerror or exc)
    except ValueError as exc:
        log.warning("%s", exc)
    return None


def token_path(token_dir: str, job: str) -> str:
    return os.path.join(token_dir, f"{job}.token")


def write_token_file(token_dir: str, job: str, token: str, uid: int | None, gid: int | None) -> str:
    """Write the job's token, owned by the job's uid, mode 0400, atomically; returns the path.

    The directory is made 0711: users can open their own file by name but not list others.
    """
    os.makedirs(token_dir, mode=0o711, exist_ok=True)
    path = token_path(token_dir, job)
    write_atomically(path, token + "\n", 0o400, encoding="ascii", uid=uid, gid=gid)
    return path


# -- what the hooks send -------------------------------------------------------------


def _source(settings: AgentSettings, hook: str, job: SlurmJob) -> str:
    # One fixed source per hook and job run: a re-run hook (or a retried post) is a duplicate.
    return f"{settings.cluster}/{job.node}:slurm-{hook}:{job.job_id}.{job.restart_count}"


def _node_token(settings: AgentSettings, secret: bytes | None, node: str) -> str | None:
    if secret is None:
        return settings.resolved_token()
    return mint_node_token(secret, settings.cluster, node, ttl_s=3600)


# -- the hooks -----------------------------------------------------------------------


def run_prolog(env: dict[str, str], settings: AgentSettings, hooks: HookSettings) -> None:
    deadline = time.monotonic() + 2 * NET_TIMEOUT_S
    started_us = wire.now_us()
    # squeue knows the job by Slurm's own id; what it says names an array task as users see it (N_i).
    fields = ask_squeue(slurm_job_id(env), hooks.squeue, NET_TIMEOUT_S, env)
    env = with_slurm_ids(env, fields)
    job = job_from_env(env, settings)
    sluid = sluid_from_env(env)
    if sluid is None and env.get("SLURM_JOB_SLUID"):
        log.warning("job %s: SLURM_JOB_SLUID is not a SLUID as slurmd prints it; not recorded", job.job_id)
    time_limit = job_time_limit(env, fields)
    name = _text(job.name or fields.get("name"))
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
        from jobsight.agent.node.registrations import Registration, write_registration

        write_registration(settings.registration_dir, Registration(
            cluster=settings.cluster, job_id=job.job_id, node=job.node, started_us=started_us,
            gpus=tuple(job.gpus), user=job.user, uid=job.uid, account=job.account, partition=job.partition,
            name=name, nodes=tuple(job.nodes), node_count=job.node_count, time_limit_s=time_limit,
            token_file=token_file, run=job.restart_count, slurm_job_id=int(slurm_job_id(env)), sluid=sluid,
        ))
    except (OSError, ValueError, ImportError) as exc:
        log.error("job %s: cannot write the registration in %s: %s", job.job_id, settings.registration_dir, exc)
    _prepare_kineto(settings, job)

    record = {
        "kind": "job_started", "job": job.job_id, "ts": started_us, "node": job.node, "user": _text(job.user),
        "uid": job.uid, "account": _text(job.account), "partition": _text(job.partition), "name": name,
        "nodes": job.nodes, "node_count": job.node_count, "gpus": [str(g) for g in job.gpus],
        "time_limit_s": time_limit, "run": job.restart_count,  # a requeued job's runs are kept apart
        # What waste policies exempt by (collector/passes/actions.py), from Slurm's own answer.
        "qos": _text(fields.get("qos")), "comment": _text(fields.get("comment")),
        "batch": {"true": True, "false": False}.get(fields.get("batch", "")),
        "sluid": sluid,
    }
    sender = HookSender(settings, _node_token(settings, secret, job.node), spool_dir(settings, env), deadline)
    sender.send(_source(settings, "prolog", job), [{k: v for k, v in record.items() if v is not None}])
    sender.replay()


def _text(value: str | None) -> str | None:
    """A value from the job's environment as the wire takes it. A user chooses their job's name (and,
    where accounting does not enforce it, its account): bytes that are not UTF-8 reach Python as lone
    surrogates, which the wire refuses, and the whole registration with them; they are kept, written
    out as escapes."""
    return (clip(value, wire.MAX_STRING) or None) if value else None


def _prepare_kineto(settings: AgentSettings, job: SlurmJob) -> None:
    """Make the job user's Kineto socket directory before any task starts: PyTorch binds its client
    socket there once, at start-up (agent/node/kineto/hooks.py)."""
    if not settings.kineto_daemon or job.uid is None:
        return
    try:
        from jobsight.agent.node.kineto.hooks import prepare_kineto_socket_dir

        prepare_kineto_socket_dir(settings, job.uid)
    except (OSError, ValueError, ImportError) as exc:
        log.error("job %s: cannot make the Kineto socket directory: %s", job.job_id, exc)


def _remove_traces(settings: AgentSettings, job: str) -> None:
    """The job's Kineto trace directory goes with the job (the daemon shipped what it read)."""
    try:
        from jobsight.agent.node.kineto.hooks import remove_job_traces

        remove_job_traces(settings.kineto_trace_dir, job)
    except ImportError as exc:
        log.error("job %s: cannot remove its trace directory: %s", job, exc)


def _kineto_exports(settings: AgentSettings, job: str) -> dict[str, str]:
    """``KINETO_USE_DAEMON=1`` and where PyTorch finds the daemon, only while the node daemon says,
    freshly, that it serves: a job is never pointed at a socket nobody (or somebody else) answers."""
    try:
        from jobsight.agent.node.kineto.hooks import kineto_serving, kineto_socket_dir_for, status_path_for

        if not kineto_serving(status_path_for(settings.registration_dir)):
            return {}
        values = {"KINETO_USE_DAEMON": "1"}
        socket_dir = kineto_socket_dir_for(settings, os.getuid())
        if socket_dir:
            values["KINETO_IPC_SOCKET_DIR"] = socket_dir
    except (OSError, ValueError, ImportError) as exc:
        log.warning("job %s: not pointing PyTorch at the node daemon: %s", job, exc)
        return {}
    # Newer Kineto writes a daemon's trace only into the directory named here.
    values["KINETO_ONDEMAND_TRACE_DIR"] = os.path.join(settings.kineto_trace_dir, job)
    return values


def _ended_run(job: SlurmJob, settings: AgentSettings) -> SlurmJob:
    """``job`` numbered as the run its prolog registered. A requeue counts the next run before the
    epilog of the one it stops runs (``SLURM_JOB_RESTART_COUNT`` 1 in run 0's epilog); the run
    that ends is the prolog's, and ``Restarts`` above it says it was requeued (end_state.py)."""
    try:
        from jobsight.agent.node.registrations import read_registration

        registration = read_registration(settings.registration_dir, job.job_id)
    except (OSError, ValueError, ImportError):
        return job
    if registration is None or registration.run >= job.restart_count:
        return job
    return replace(job, restart_count=registration.run)


def run_epilog(env: dict[str, str], settings: AgentSettings, hooks: HookSettings) -> None:
    deadline = time.monotonic() + 2 * NET_TIMEOUT_S
    # Slurm's own id for squeue: an array task's or a heterogeneous component's, not the one users see,
    # which comes from what squeue says (the epilog's environment names no array), as in the prolog.
    fields = ask_squeue(slurm_job_id(env), hooks.squeue, NET_TIMEOUT_S, env)
    env = with_slurm_ids(env, fields)
    job = _ended_run(job_from_env(env, settings), settings)
    secret = read_secret(hooks.secret_file)
    record: dict[str, Any] = {"kind": "job_ended", "job": job.job_id, "ts": wire.now_us(), "node": job.node,
                              "run": job.restart_count}
    state, exit_code = end_state(fields, job.restart_count, exit_code_from_env(env))
    if exit_code is not None:
        record["exit_code"] = exit_code
    if state is not None:
        record["state"] = state
    sender = HookSender(settings, _node_token(settings, secret, job.node), spool_dir(settings, env), deadline)
    sender.send(_source(settings, "epilog", job), [record])
    try:
        from jobsight.agent.node.registrations import remove_registration

        remove_registration(settings.registration_dir, job.job_id)
    except (OSError, ValueError, ImportError) as exc:
        log.error("job %s: cannot remove the registration: %s", job.job_id, exc)
    try:
        os.unlink(token_path(hooks.token_dir, job.job_id))
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.error("job %s: cannot remove the token file: %s", job.job_id, exc)
    _remove_traces(settings, job.job_id)
    sender.replay()


def task_prolog_lines(env: dict[str, str], settings: AgentSettings, hooks: HookSettings) -> list[str]:
    """The ``export`` lines, one variable each (Slurm reads one per line). Values that
    would need quoting are left out rather than risk a broken environment."""
    job = job_id_from_env(env)
    values = {"JOBSIGHT_URL": settings.url, "JOBSIGHT_CLUSTER": settings.cluster, "JOBSIGHT_JOB_ID": job}
    # The node as the prolog registered it (hooks.env's JOBSIGHT_NODE, else Slurm's SLURMD_NODENAME), not
    # the host name a process would fall back to (a fully qualified one maps no rank to a GPU). Only a
    # plain host name: anything else is left out (logged), and the process names its host as before.
    node = node_name_from_env(env)
    if node:
        values["JOBSIGHT_NODE"] = node
    elif env.get("JOBSIGHT_NODE") or env.get("SLURMD_NODENAME"):
        log.warning("job %s: the node name is not a plain host name; JOBSIGHT_NODE left out", job)
    # PyTorch then asks the node daemon for a profiling config (agent/node/kineto/service.py); a
    # job's own KINETO_USE_DAEMON (0 to opt out) is left as it is.
    if settings.kineto_daemon and "KINETO_USE_DAEMON" not in env:
        values.update(_kineto_exports(settings, job))
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


def run_hook(hook: str, env: dict[str, str] | None = None) -> int:
    """Run one hook; always returns 0 (problems are logged)."""
    env = dict(os.environ) if env is None else env
    try:
        hooks = load_hook_settings(env)
        setup_hook_logging(hook, hooks.log_file)
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
