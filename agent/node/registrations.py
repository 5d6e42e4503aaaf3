"""Node-local job registrations: ``<registration_dir>/<job_id>.json``.

The Slurm prolog writes one file per job starting on the node (as root, before
the job's first task); the epilog removes it. The node daemon reads them every
tick to know which job holds which GPU, and the in-process sampler looks for
its job's file to learn that a daemon serves the job.

The file is a JSON object, written atomically (temporary file + rename) with mode
0644 so the job's own processes can read it::

    {"version": 1, "cluster": "default", "job_id": "123", "user": "ana", "uid": 1000,
     "account": "physics", "partition": "gpu", "name": "train", "node": "gpu01",
     "nodes": ["gpu01", "gpu02"], "node_count": 2, "gpus": [0, 1],
     "time_limit_s": 86400, "started_us": 1763769600000000,
     "token_file": "/run/jobsight/tokens/123", "slurm_job_id": 123, "sluid": "s8FXKTA79XAR00"}

``gpus`` holds the NVML (GRES) indices of the job's GPUs on this node, ``[]`` for a
job without GPUs. ``slurm_job_id`` is Slurm's own number of the job (``SLURM_JOB_ID``: an
array task's own id, which its cgroup names, where ``job_id`` is ``<array job>_<task>``); files
without it still read. ``sluid`` is the run's SLUID (``SLURM_JOB_SLUID``, Slurm 26.05 and later), which
names the job's cgroup v2 folder; absent from files of older Slurm or older prologs. Keys this version
does not know are ignored, so a newer prolog may add fields without breaking an older daemon.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from jobsight.agent.atomic_files import write_atomically
from jobsight.protocol.sluid import is_sluid

log = logging.getLogger("jobsight.agent.registrations")

VERSION: Final = 1
SUFFIX: Final = ".json"
FILE_MODE: Final = 0o644
DIR_MODE: Final = 0o755

# Slurm job ids are digits, with "_<n>" for array tasks and "+<n>" for
# heterogeneous components; anything else must not become a path.
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$")


class RegistrationError(ValueError):
    """A registration file that cannot be read or does not follow the format."""


def check_job_id(job_id: str) -> str:
    """``job_id`` unchanged when it is safe as a file name; :class:`RegistrationError` otherwise."""
    if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        raise RegistrationError(f"job id {job_id!r} is not a valid registration name")
    return job_id


@dataclass(frozen=True)
class Registration:
    """One job on this node. ``None`` means the prolog could not tell."""

    cluster: str
    job_id: str
    node: str
    """The Slurm node name the prolog ran on."""
    started_us: int
    """Job start, microseconds since the Unix epoch."""
    gpus: tuple[int, ...] = ()
    """NVML indices of the job's GPUs on this node; empty for a job without GPUs."""
    user: str | None = None
    uid: int | None = None
    account: str | None = None
    partition: str | None = None
    name: str | None = None
    nodes: tuple[str, ...] | None = None
    """Every node of the job (the expanded ``SLURM_JOB_NODELIST``)."""
    node_count: int | None = None
    time_limit_s: int | None = None
    token_file: str | None = None
    """The job's ingest token file, readable by the job's user only."""
    run: int = 0
    """The run's ``SLURM_JOB_RESTART_COUNT`` as its prolog saw it: a requeued job's epilog sees the
    next run's count already, and learns which run it ends from here."""
    slurm_job_id: int | None = None
    """Slurm's own id (``SLURM_JOB_ID``), the number in the job's cgroup (``job_<id>``): an array
    task's differs from ``job_id``. ``None``: an older prolog's file."""
    sluid: str | None = None
    """The run's SLUID as slurmd prints it (``s8FXKTA79XAR00``, :mod:`jobsight.protocol.sluid`), the name
    of its cgroup v2 folder since Slurm 26.05. ``None``: older Slurm (no ``SLURM_JOB_SLUID``), an older
    prolog's file, or a value not in that form."""
    version: int = VERSION

    def to_json(self) -> str:
        data = asdict(self)
        data["gpus"] = list(self.gpus)
        data["nodes"] = list(self.nodes) if self.nodes is not None else None
        if self.slurm_job_id is None:
            del data["slurm_job_id"]  # a file without it stays what older prologs wrote
        if self.sluid is None:
            del data["sluid"]
        return json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n"

    @classmethod
    def from_dict(cls, data: Any) -> Registration:
        """Check and convert a parsed file; :class:`RegistrationError` names the bad key."""
        if not isinstance(data, dict):
            raise RegistrationError("not a JSON object")
        version = data.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise RegistrationError("key 'version': expected a positive integer")

        # Descriptive keys of the wrong type read as None (lose a field, never the
        # job); the keys attribution depends on must be right.
        def text(key: str, required: bool = False) -> str | None:
            value = data.get(key)
            if isinstance(value, str) and value:
                return value
            if required:
                raise RegistrationError(f"key {key!r}: expected a non-empty string")
            return None

        def integer(key: str, required: bool = False) -> int | None:
            value = data.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if required:
                raise RegistrationError(f"key {key!r}: expected an integer")
            return None

        gpus = data.get("gpus", [])
        if gpus is None:
            gpus = []
        if not isinstance(gpus, list) or any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in gpus):
            raise RegistrationError("key 'gpus': expected a list of GPU indices")
        nodes = data.get("nodes")
        if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
            nodes = None
        job_id = text("job_id", required=True)
        assert job_id is not None
        try:
            check_job_id(job_id)
        except RegistrationError as exc:
            raise RegistrationError(f"key 'job_id': {exc}") from None
        started = integer("started_us", required=True)
        assert started is not None
        return cls(
            cluster=text("cluster") or "default",
            job_id=job_id,
            node=text("node", required=True) or "",
            started_us=started,
            gpus=tuple(dict.fromkeys(gpus)),
            user=text("user"),
            uid=integer("uid"),
            account=text("account"),
            partition=text("partition"),
            name=text("name"),
            nodes=tuple(nodes) if nodes is not None else None,
            node_count=integer("node_count"),
            time_limit_s=integer("time_limit_s"),
            token_file=text("token_file"),
            run=max(integer("run") or 0, 0),
            slurm_job_id=_positive(integer("slurm_job_id")),
            # Matched against cgroup folder names: only Slurm's own spelling, else none (never guessed).
            sluid=data["sluid"] if is_sluid(data.get("sluid")) else None,
            version=version,
        )

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Registration:
        """Read one file; :class:`RegistrationError` when it is unreadable or garbled."""
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise RegistrationError(f"cannot read {path}: {exc}") from None
        try:
            registration = cls.from_dict(data)
        except RegistrationError as exc:
            raise RegistrationError(f"{path}: {exc}") from None
        stem = Path(path).name.removesuffix(SUFFIX)
        if stem != registration.job_id:
            raise RegistrationError(f"{path}: holds job {registration.job_id!r}, not {stem!r}")
        return registration


def _positive(value: int | None) -> int | None:
    return value if value is not None and value > 0 else None


def registration_path(directory: str | os.PathLike[str], job_id: str) -> Path:
    return Path(directory) / f"{check_job_id(job_id)}{SUFFIX}"


def write_registration(directory: str | os.PathLike[str], registration: Registration) -> Path:
    """Write (or replace) the job's file atomically, mode 0644; returns its path.

    The directory is created (0755) when missing. Raises ``OSError`` when it cannot
    be written and :class:`RegistrationError` for a job id unfit for a file name.
    """
    target = registration_path(directory, registration.job_id)
    target.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    write_atomically(target, registration.to_json(), FILE_MODE)
    return target


def remove_registration(directory: str | os.PathLike[str], job_id: str) -> bool:
    """Remove the job's file; ``False`` when there was none."""
    try:
        registration_path(directory, job_id).unlink()
    except FileNotFoundError:
        return False
    return True


def read_registration(directory: str | os.PathLike[str], job_id: str) -> Registration | None:
    """The job's registration; ``None`` when there is none or it cannot be read."""
    try:
        return Registration.from_file(registration_path(directory, job_id))
    except RegistrationError:
        return None


def has_registration(directory: str | os.PathLike[str], job_id: str) -> bool:
    """Whether a file for ``job_id`` exists (a daemon on this node serves the job)."""
    try:
        return registration_path(directory, job_id).is_file()
    except (RegistrationError, OSError):
        return False


_warned: set[tuple[str, int, int]] = set()
_warned_lock = threading.Lock()


def _warn_once(path: Path, error: Exception) -> None:
    try:
        stat = path.stat()
        key = (str(path), stat.st_mtime_ns, stat.st_size)
    except OSError:
        key = (str(path), 0, 0)
    with _warned_lock:
        if key in _warned:
            return
        if len(_warned) > 10_000:
            _warned.clear()
        _warned.add(key)
    log.warning("jobsight: skipping registration: %s", error)


def read_registrations(directory: str | os.PathLike[str]) -> list[Registration]:
    """Every readable registration in ``directory``, sorted by job id.

    A missing directory means no jobs. An unreadable or garbled file is skipped and
    logged once (again only after it changes).
    """
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as exc:
        _warn_once(Path(directory), exc)
        return []
    found: list[Registration] = []
    for name in names:
        if name.startswith(".") or not name.endswith(SUFFIX):
            continue
        path = Path(directory) / name
        try:
            found.append(Registration.from_file(path))
        except RegistrationError as exc:
            if path.exists():  # removed by the epilog between listdir and open: not a problem
                _warn_once(path, exc)
    found.sort(key=lambda r: r.job_id)
    return found
