"""Slurm's cgroup paths, read in one place: which job a process is in, and where a job's cgroup is.

Slurm builds these paths (Slurm 26.05.3's source; 22.05 builds the same ones, without SLUIDs)::

    v2  /system.slice/slurmstepd.scope/job_42/step_0/user/task_0
        /system.slice/slurmstepd.scope/s8FXKTA79XAR00/step_batch/user/task_0
        /system.slice/node7_slurmstepd.scope/job_42/step_extern/slurm
    v1  /slurm/uid_1000/job_42/step_0/task_0                 (in each controller's hierarchy)
        /slurm_node7/uid_1000/job_42/step_batch/task_0

* v2, the scope: ``<init path>/<CgroupSlice>/slurmstepd.scope``, or ``<node>_slurmstepd.scope`` where
  several slurmd share a host (MULTIPLE_SLURMD): src/plugins/cgroup/v2/cgroup_v2.c:434-447; the slice
  is ``system.slice`` unless cgroup.conf's ``CgroupSlice`` names another (:67, :436-438).
* v2, the job folder: ``job_<id>`` with ``CgroupJobIdPaths=yes``, else the job's SLUID (cgroup_v2.c:1931-1937),
  printed as ``s`` and 13 Crockford base-32 characters (src/common/sluid.c:51, :116-135;
  :mod:`jobsight.protocol.sluid`).
* v2, below it: ``step_<step>`` (cgroup_v2.c:1954-1958; the step as src/common/log.c:1745-1762 prints it:
  ``batch``, ``extern``, ``interactive``, ``TBD``, a number, ``<number>+<het component>``), then
  ``user`` (the tasks, :1985) or ``slurm`` (slurmstepd itself, :2009), then ``task_<n>`` or
  ``task_special`` (:2760-2767).
* v1: ``/slurm`` or, with several slurmd, ``/slurm_<node>`` (src/interfaces/cgroup.c:195-199,
  src/plugins/cgroup/v1/xcgroup.c:365-376), then ``uid_<uid>`` (xcgroup.c:414), ``job_<id>`` (:424; v1
  never uses SLUIDs), ``step_<step>`` (:439), ``task_<n>`` (src/plugins/cgroup/v1/cgroup_v1.c:339).

Each part is read at its fixed depth only. Below ``step_*`` a job may make cgroups of its own
(``.../step_0/user/task_0/job_999``): nothing there names a job, so no job poses as another by
naming a folder. The v2 scope counts only under slices (``*.slice``, the folders systemd and root
make), so a user's own delegated cgroups (``user@1000.service/...``) name no job either.

A SLUID folder is matched to a job only through the SLUID its registration holds (the prolog's
``SLURM_JOB_SLUID``), never guessed from the number.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from jobsight.agent.node.registrations import Registration
from jobsight.protocol.sluid import is_sluid

MAX_CGROUP_BYTES: Final = 64 * 1024
MAX_SLICES: Final = 3
"""Slices above the v2 scope, at most: systemd nests ``a-b.slice`` in ``a.slice``."""
JOB_CONTROLLERS: Final = ("cpuacct", "memory", "cpuset")
"""The v1 controllers whose job folders are looked for."""

# [0-9], never \d: str patterns match every Unicode digit ("²", "٣"), which int() then refuses.
_JOB_NUMBER = re.compile(r"job_([0-9]{1,10})")
_STEP = re.compile(r"step_(batch|extern|interactive|TBD|[0-9]{1,10}(?:\+[0-9]{1,5})?)")
_TASK = re.compile(r"task_(?:[0-9]{1,10}|special)")
_UID = re.compile(r"uid_[0-9]{1,10}")
_V1_TOP = re.compile(r"slurm(?:_(.+))?")
_V2_SCOPE = re.compile(r"(?:(.+)_)?slurmstepd\.scope")
_SLURM_PART = re.compile(r"slurm(?:_.*)?|(?:.+_)?slurmstepd\.scope")


@dataclass(frozen=True)
class JobFolder:
    """The job a Slurm cgroup folder names: its number (``job_<id>``) or its SLUID, one of the two."""

    number: int | None = None
    sluid: str | None = None

    @property
    def name(self) -> str:
        """The folder's name: ``job_42`` or ``s8FXKTA79XAR00``."""
        return self.sluid if self.sluid is not None else f"job_{self.number}"

    def __str__(self) -> str:
        return self.sluid if self.sluid is not None else str(self.number)


def job_folder(name: str) -> JobFolder | None:
    """The job a folder's ``name`` names; ``None`` when it is no job folder."""
    if (match := _JOB_NUMBER.fullmatch(name)) is not None:
        return JobFolder(number=int(match.group(1)))
    if is_sluid(name):
        return JobFolder(sluid=name)
    return None


@dataclass(frozen=True)
class SlurmPath:
    """One cgroup path as Slurm laid it out. ``job`` ``None``: slurmstepd's own cgroup (the scope,
    ``/slurm/uid_0``), in Slurm but in no job; ``step`` ``None``: the job's folder itself."""

    version: int
    node: str | None = None
    """The node of ``<node>_slurmstepd.scope`` or ``/slurm_<node>``; ``None``: one slurmd per host."""
    job: JobFolder | None = None
    step: str | None = None
    """``batch``, ``extern``, ``interactive``, ``0``, ``0+1``..."""


def parse_path(path: str, version: int) -> SlurmPath | None:
    """``path`` (of a ``/proc/<pid>/cgroup`` line; ``version`` 2 for the ``0::`` line, else 1) read at
    Slurm's depths; ``None`` when it is not where Slurm puts its cgroups."""
    parts = [part for part in path.split("/") if part]
    return _parse_v2(parts) if version == 2 else _parse_v1(parts)


def _parse_v2(parts: list[str]) -> SlurmPath | None:
    # The scope's parent folders are slices (cgroup_v2.c:441-447): a user's delegated cgroups never are.
    for at, part in enumerate(parts[:MAX_SLICES + 1]):
        scope = _V2_SCOPE.fullmatch(part)
        if scope is not None:
            return _below_job(2, scope.group(1), parts[at + 1:])
        if not part.endswith(".slice"):
            return None
    return None


def _parse_v1(parts: list[str]) -> SlurmPath | None:
    top = _V1_TOP.fullmatch(parts[0]) if parts else None
    if top is None:
        return None
    if len(parts) < 2 or not _UID.fullmatch(parts[1]):
        return SlurmPath(1, top.group(1))
    return _below_job(1, top.group(1), parts[2:])


def _below_job(version: int, node: str | None, parts: list[str]) -> SlurmPath:
    """The job and step of ``parts`` (the path below the scope, or below ``uid_<uid>``)."""
    job = job_folder(parts[0]) if parts else None
    if job is None or (version == 1 and job.sluid is not None):
        return SlurmPath(version, node)  # slurmstepd's own cgroup (".../slurmstepd.scope/system")
    step = _STEP.fullmatch(parts[1]) if len(parts) > 1 else None
    return SlurmPath(version, node, job, step.group(1) if step is not None else None)


@dataclass(frozen=True)
class CgroupPlace:
    """Where a process sits: in Slurm at all, and in which job (``None``: none, or lines that disagree)."""

    in_slurm: bool
    job: JobFolder | None = None
    step: str | None = None
    """``None``: unknown, or the lines disagree."""
    node: str | None = None
    version: int | None = None
    """2 when the job came from the ``0::`` line, 1 from a controller's; ``None`` without a job."""


def parse_cgroup(text: str) -> CgroupPlace:
    """The Slurm job of a ``/proc/<pid>/cgroup`` text: every line that names a job must name the same one.

    A path with a Slurm-looking part anywhere else (``slurmstepd.scope`` where no slice holds it, a
    job's own ``.../user/slurm_x``) is in Slurm, in no job: its process is not taken at its
    environment's word either."""
    found: list[SlurmPath] = []
    in_slurm = False
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        place = parse_path(path, 2 if hierarchy == "0" and not controllers else 1)
        if place is not None:
            in_slurm = True
            if place.job is not None:
                found.append(place)
        elif any(_SLURM_PART.fullmatch(part) for part in path.split("/")):
            in_slurm = True
    if not found or len({place.job for place in found}) != 1:
        return CgroupPlace(in_slurm)
    steps = {place.step for place in found}
    first = found[0]
    return CgroupPlace(True, first.job, steps.pop() if len(steps) == 1 else None, first.node, first.version)


def read_place(pid: int, proc_root: str = "/proc") -> CgroupPlace | None:
    """Where ``pid`` sits; ``None`` when its cgroup file cannot be read (it has gone)."""
    try:
        with open(os.path.join(proc_root, str(pid), "cgroup"), "rb") as handle:
            raw = handle.read(MAX_CGROUP_BYTES)
    except OSError:
        return None
    return parse_cgroup(raw.decode("utf-8", "replace"))


# -- registrations ----------------------------------------------------------------------------------


def sluid_of(registration: Registration) -> str | None:
    """The SLUID the prolog registered (``SLURM_JOB_SLUID``, Slurm 26.05 on); ``None``: none, or not one."""
    return registration.sluid if is_sluid(registration.sluid) else None


def registration_of(job: JobFolder, registrations: Iterable[Registration]) -> Registration | None:
    """The registration of the job a cgroup folder names: by the SLUID it registered, or by Slurm's
    number (the registration that says so, else, from a prolog that did not say, the one registered
    under that very number). ``None``: no job here."""
    fallback = None
    for registration in registrations:
        if job.sluid is not None:
            if sluid_of(registration) == job.sluid:
                return registration
        elif registration.slurm_job_id == job.number:
            return registration
        elif registration.slurm_job_id is None and registration.job_id == str(job.number):
            fallback = registration
    return fallback


def folders_of(registration: Registration) -> tuple[JobFolder, ...]:
    """The folders that may hold a registered job, SLUID first (26.05's default): both where known."""
    folders = []
    if (sluid := sluid_of(registration)) is not None:
        folders.append(JobFolder(sluid=sluid))
    if registration.slurm_job_id is not None:
        folders.append(JobFolder(number=registration.slurm_job_id))
    elif registration.job_id.isascii() and registration.job_id.isdigit() and len(registration.job_id) <= 10:
        folders.append(JobFolder(number=int(registration.job_id)))
    return tuple(folders)


# -- a job's folders on the node -------------------------------------------------------------------


@dataclass(frozen=True)
class JobDirs:
    """A job's cgroup directories: v2's one, or v1's per controller."""

    version: int
    dirs: tuple[tuple[str, str], ...]
    """``(controller, directory)``; v2's one directory under controller ``""``."""

    def of(self, controller: str) -> str | None:
        """The directory holding ``controller``'s files; ``None``: v1 without that controller's job folder."""
        for name, path in self.dirs:
            if self.version == 2 or name == controller:
                return path
        return None

    def exist(self) -> bool:
        return all(os.path.isdir(path) for _, path in self.dirs)


def is_v2(cgroup_root: str) -> bool:
    """Whether ``cgroup_root`` is a cgroup v2 mount (hybrid v1 hosts keep theirs in ``unified/``)."""
    return os.path.exists(os.path.join(cgroup_root, "cgroup.controllers"))


def find_job_dirs(cgroup_root: str, folders: Sequence[JobFolder], node: str | None = None,
                  controllers: Sequence[str] = JOB_CONTROLLERS) -> JobDirs | None:
    """Where the job of ``folders`` (:func:`folders_of`) has its cgroup under ``cgroup_root``, only at
    Slurm's depths; ``node``'s own scope (or ``slurm_<node>``) first where several slurmd share the
    host. ``None``: nowhere (not started yet, ended, or no cgroup plugin)."""
    if is_v2(cgroup_root):
        for scope in _ordered(_v2_scopes(cgroup_root), node):
            for folder in folders:
                path = os.path.join(scope[1], folder.name)
                if os.path.isdir(path):
                    return JobDirs(2, (("", path),))
        return None
    numbers = [folder for folder in folders if folder.number is not None]
    found = []
    for controller in controllers:
        mount = _v1_mount(cgroup_root, controller)
        job_dir = _v1_job_dir(mount, numbers, node) if mount is not None else None
        if job_dir is not None:
            found.append((controller, job_dir))
    return JobDirs(1, tuple(found)) if found else None


def _subdirs(path: str) -> list[str]:
    try:
        with os.scandir(path) as entries:
            return sorted(entry.name for entry in entries if entry.is_dir())
    except OSError:
        return []


def _v2_scopes(root: str, depth: int = 0) -> Iterator[tuple[str | None, str]]:
    """``(node, path)`` of each slurmstepd scope in the slices of ``root`` (cgroup_v2.c:441-447)."""
    for name in _subdirs(root):
        scope = _V2_SCOPE.fullmatch(name)
        if scope is not None:
            yield scope.group(1), os.path.join(root, name)
        elif name.endswith(".slice") and depth < MAX_SLICES:
            yield from _v2_scopes(os.path.join(root, name), depth + 1)


def _ordered(places: Iterable[tuple[str | None, str]], node: str | None) -> list[tuple[str | None, str]]:
    """``node``'s own places first, then one slurmd's, then other nodes'."""
    return sorted(places, key=lambda place: (place[0] != node, place[0] is not None, place[1]))


def _v1_mount(root: str, controller: str) -> str | None:
    """The v1 hierarchy holding ``controller`` (``memory``, ``cpu,cpuacct``...)."""
    for name in _subdirs(root):
        if controller in name.split(","):
            return os.path.join(root, name)
    return None


def _v1_job_dir(mount: str, folders: Sequence[JobFolder], node: str | None) -> str | None:
    tops = ((match.group(1), os.path.join(mount, name))
            for name in _subdirs(mount) if (match := _V1_TOP.fullmatch(name)) is not None)
    for _node, top in _ordered(tops, node):
        for uid in _subdirs(top):
            if _UID.fullmatch(uid):
                for folder in folders:
                    path = os.path.join(top, uid, folder.name)
                    if os.path.isdir(path):
                        return path
    return None


# -- a job's processes ------------------------------------------------------------------------------


def pids_by_job(registrations: Sequence[Registration], proc_root: str = "/proc") -> dict[str, list[int]]:
    """Every process on the node in the cgroup of a job registered here, by registered job id, in pid
    order: a full scan of ``proc_root``, for jobs whose CPU time no cgroup counts."""
    jobs: dict[str, list[int]] = {}
    try:
        names = os.listdir(proc_root)
    except OSError:
        return jobs
    for name in sorted(names, key=lambda n: (len(n), n)):
        if not (name.isascii() and name.isdigit()):
            continue
        place = read_place(int(name), proc_root)
        if place is None or place.job is None:
            continue
        registration = registration_of(place.job, registrations)
        if registration is not None:
            jobs.setdefault(registration.job_id, []).append(int(name))
    return jobs
