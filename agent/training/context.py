"""Who is running: the job, node and rank that every record of this process carries.

Inside Slurm the job id is ``SLURM_JOB_ID`` (or ``JOBSIGHT_JOB_ID`` from the task
prolog). Outside Slurm a local id ``local-<host>-<pid>-<start>`` is made from the
process that launched the run, and exported as ``JOBSIGHT_JOB_ID`` into
``os.environ`` so every child started afterwards (DataLoader workers, ``mp.spawn``
ranks, subprocesses) inherits the same id.

The launching process is this process, except under a torch launcher
(``TORCHELASTIC_RUN_ID`` set, or ``MASTER_PORT`` together with ``RANK``/``LOCAL_RANK``):
then it is the parent, the launcher every local rank shares, so all ranks of one
run on one node get one id even though none of them ran first.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from jobsight.agent.settings import AgentSettings

JOB_ID_ENV = "JOBSIGHT_JOB_ID"

_IMPORT_TIME = int(time.time())
_lock = threading.Lock()


@dataclass(frozen=True)
class RunContext:
    job: str
    node: str
    rank: int | None
    """Global rank (``RANK`` or ``SLURM_PROCID``); ``None`` when not a distributed run."""
    local_rank: int | None
    """Rank on this node (``LOCAL_RANK`` or ``SLURM_LOCALID``); ``None`` when unknown."""
    cluster: str


def _env_int(*names: str) -> int | None:
    for name in names:
        raw = os.environ.get(name)
        if raw is None or raw.strip() == "":
            continue
        try:
            return int(raw)
        except ValueError:
            continue
    return None


def process_start_time(pid: int | None = None, proc_root: str = "/proc") -> int | None:
    """Start time of ``pid`` (default: this process) in Unix seconds.

    ``None`` means it could not be read (no ``/proc``, process gone).
    """
    pid = os.getpid() if pid is None else pid
    try:
        with open(os.path.join(proc_root, str(pid), "stat"), encoding="ascii") as handle:
            stat = handle.read()
        # The command name (field 2) may hold spaces and parentheses; fields after
        # the last ")" are fixed. starttime is field 22, i.e. index 19 after it.
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        with open(os.path.join(proc_root, "stat"), encoding="ascii") as handle:
            btime = next(int(line.split()[1]) for line in handle if line.startswith("btime "))
        return btime + ticks // os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def process_owner(uid: int | None = None) -> dict[str, Any]:
    """Who runs this process, for a run's metadata: ``uid``, ``user`` (the passwd name of ``uid``,
    default this process's; else ``LOGNAME``/``USER``; ``None`` when neither tells, e.g. a container
    uid without a passwd entry) and ``slurm`` (whether Slurm started it). Outside Slurm no prolog
    says whose job it is, so this is the only user the job page has to show."""
    uid = os.getuid() if uid is None else uid
    user: str | None
    try:
        import pwd  # Unix only, like the agent

        user = pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        user = next((os.environ[n] for n in ("LOGNAME", "USER") if os.environ.get(n)), None)
    return {"user": user, "uid": uid, "slurm": bool(os.environ.get("SLURM_JOB_ID"))}


def _launched_by_torch() -> bool:
    env = os.environ
    if env.get("TORCHELASTIC_RUN_ID"):
        return True
    return bool(env.get("MASTER_PORT")) and ("RANK" in env or "LOCAL_RANK" in env)


def local_job_id(node: str) -> str:
    """The id of a run outside Slurm: ``local-<host>-<pid>-<start>`` of its launching process."""
    pid = os.getpid()
    start: int | None = None
    if _launched_by_torch():
        parent = os.getppid()
        start = process_start_time(parent)
        if start is not None:
            pid = parent
    if start is None:
        start = process_start_time(pid) or _IMPORT_TIME
    return f"local-{node}-{pid}-{start}"


def current_context(settings: AgentSettings) -> RunContext:
    """The run context of the calling process, read from settings and the environment now."""
    job = settings.job_id or os.environ.get(JOB_ID_ENV) or os.environ.get("SLURM_JOB_ID")
    if not job:
        with _lock:
            job = os.environ.get(JOB_ID_ENV)
            if not job:
                job = local_job_id(settings.node)
                # Children started from now on inherit the id (see the module docstring).
                os.environ[JOB_ID_ENV] = job
    return RunContext(
        job=job,
        node=settings.node,
        rank=_env_int("RANK", "SLURM_PROCID"),
        local_rank=_env_int("LOCAL_RANK", "SLURM_LOCALID"),
        cluster=settings.cluster,
    )
