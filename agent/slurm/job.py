"""The job a Slurm hook runs for, from slurmd's environment (see ``tests/slurm/NOTES.md``):
its id, node and user, its GPUs, its time limit (with Slurm's structured answer,
:mod:`jobsight.agent.slurm.squeue`, for what the environment lacks), its run's SLUID (26.05 and later)
and, in the epilog, its exit code. Nothing here reads text a user wrote (a job name is carried,
never parsed)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from jobsight.agent.settings import AgentSettings
from jobsight.protocol.sluid import is_sluid
from jobsight.protocol.slurm_ids import job_id_from_env

# A plain host name (HOST_NAME_MAX is 64): what a task prolog may export as a job's node.
_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


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


def with_slurm_ids(env: dict[str, str], fields: dict[str, str]) -> dict[str, str]:
    """``env`` with the array and heterogeneous-job ids that Slurm's answer
    (:func:`jobsight.agent.slurm.squeue.ask_squeue`) gave and the
    environment lacks (slurmd's prolog and epilog environment has none of them in 22.05; the task
    prolog's has them), so that :func:`job_id_from_env` names the job alike in every hook."""
    added = {name: fields[key] for name, key in (("SLURM_ARRAY_JOB_ID", "array_job_id"),
                                                 ("SLURM_ARRAY_TASK_ID", "array_task_id"),
                                                 ("SLURM_HET_JOB_ID", "het_job_id"))
             if key in fields and not env.get(name)}
    return {**env, **added} if added else env


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
    job = job_id_from_env(env)
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


def sluid_from_env(env: dict[str, str]) -> str | None:
    """The run's SLUID from ``SLURM_JOB_SLUID`` (slurmd gives it to the prolog and epilog since 26.05);
    ``None`` on older Slurm, or for a value not in the form slurmd prints (:mod:`jobsight.protocol.sluid`)."""
    value = env.get("SLURM_JOB_SLUID")
    return value if is_sluid(value) else None


def node_name_from_env(env: dict[str, str]) -> str | None:
    """The node a job's processes run on as jobsight names it: ``JOBSIGHT_NODE`` (hooks.env: the node
    daemon's name, which the prolog registers too), else Slurm's ``SLURMD_NODENAME``. ``None`` when
    neither is given or the name is not a plain host name (letters, digits, ``.``, ``_``, ``-``; at
    most 64 characters)."""
    node = env.get("JOBSIGHT_NODE") or env.get("SLURMD_NODENAME") or ""
    return node if _HOST_NAME.fullmatch(node) else None


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
