"""The embedded PostgreSQL against the other users of its host.

Every local user can reach a loopback port, and the server's superuser can run programs as the
account that runs it (``COPY ... PROGRAM``), so TCP logins need the password kept in the data
directory, which no one else can read. Tested the way such a user would try it: ``psql`` run as
``nobody`` (tests run as root; ``setpriv`` drops to that uid, its group and no others).
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from jobsight.collector.store import migrate
from jobsight.collector.store.embedded_db import EmbeddedPostgres, free_port
from tests.collector.test_up import Up, _gpu_batch, _request
from tests.conftest import create_database

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another local user needs root (setpriv)")

NOBODY = pwd.getpwnam("nobody")


def _as_nobody(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``argv`` as the local user ``nobody``, with a bare environment (no PGPASSWORD, no ~/.pgpass)."""
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}", "--clear-groups", "--", *argv],
        capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": NOBODY.pw_dir, "LC_ALL": "C", **(env or {})},
    )


def _psql(server: EmbeddedPostgres, host: str, password: str | None = None) -> subprocess.CompletedProcess[str]:
    """``SELECT current_user`` through ``psql -w`` (never prompts) as ``nobody``."""
    return _as_nobody(str(server.binary("psql")), "-w", "-h", host, "-p", str(server.port), "-U", "postgres",
                      "-d", "jobsight", "-tAc", "SELECT current_user",
                      env={"PGPASSWORD": password} if password is not None else None)


def _hba_rules(server: EmbeddedPostgres) -> set[tuple[str, str]]:
    """(connection type, method) of every rule of the server's pg_hba.conf."""
    rules: set[tuple[str, str]] = set()
    for line in (server.data_dir / "pg_hba.conf").read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if fields:
            rules.add((fields[0], fields[-1]))
    return rules


def _assert_closed_to_others(server: EmbeddedPostgres) -> None:
    password = server.password
    assert password is not None and len(password) >= 40
    without = _psql(server, "127.0.0.1")
    assert without.returncode == 2 and "fe_sendauth: no password supplied" in without.stderr, without
    wrong = _psql(server, "127.0.0.1", "not-" + password)
    assert wrong.returncode == 2, wrong
    assert 'password authentication failed for user "postgres"' in wrong.stderr
    # The trusted Unix socket lies in the data directory, which nobody may enter.
    socket = _psql(server, str(server.data_dir))
    assert socket.returncode == 2 and "Permission denied" in socket.stderr, socket
    for name in ("pgpass", "pg_hba.conf"):
        read = _as_nobody("cat", str(server.data_dir / name))
        assert read.returncode == 1 and "Permission denied" in read.stderr and password not in read.stdout, name
    # The control: the same psql as the same user gets in with the password, so what stopped it
    # above was the missing password, nothing else.
    right = _psql(server, "127.0.0.1", password)
    assert (right.returncode, right.stdout.strip()) == (0, "postgres"), right
    # Root has no password file either: over TCP it needs the URL's password like anyone.
    with pytest.raises(psycopg.OperationalError, match="no password supplied"):
        psycopg.connect(host="127.0.0.1", port=server.port, user="postgres", dbname="jobsight", connect_timeout=10)
    assert _hba_rules(server) == {("local", "trust"), ("host", "scram-sha-256")}
    directory, pgpass = server.data_dir.stat(), server.password_file.stat()
    assert stat.S_IMODE(directory.st_mode) == 0o700 and stat.S_IMODE(pgpass.st_mode) == 0o600
    assert pgpass.st_uid == directory.st_uid != NOBODY.pw_uid
    assert server.password_file.read_text() == f"*:*:*:postgres:{password}\n"


def test_the_session_server_needs_its_password(postgres: EmbeddedPostgres, database_url: str) -> None:
    _assert_closed_to_others(postgres)
    # The owner's URL works in each shape the callers make of it: psycopg, the conftest's
    # "<server>/<database>", and SQLAlchemy/Alembic (the session database was migrated through it).
    assert postgres.url == f"postgresql://postgres:{postgres.password}@127.0.0.1:{postgres.port}/jobsight"
    with psycopg.connect(postgres.url) as conn:
        assert conn.execute("SELECT current_user, current_database()").fetchone() == ("postgres", "jobsight")
    url = create_database(postgres, "t_auth_shape")
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("t_auth_shape",)
    assert database_url.startswith(f"postgresql://postgres:{postgres.password}@")
    assert migrate.current_revision(database_url) == migrate.head_revision()
    assert postgres.password is not None and postgres.password not in repr(postgres)


def test_a_trust_data_directory_of_an_older_version_is_closed_on_start(tmp_path: Path) -> None:
    """A data directory initialised and left running by the previous version (``--auth=trust``,
    ``jobsight up`` killed) is stopped, given pg_hba.conf and a password, and keeps its data."""
    server = EmbeddedPostgres(tmp_path / "old")
    data = str(server.data_dir)
    # What the previous version ran, word for word.
    server._prepare_data_dir()
    server._run(["initdb", "-D", data, "-U", "postgres", "--auth=trust", "--encoding=UTF8"])
    port = free_port()
    server._run(["pg_ctl", "-D", data, "-l", f"{data}/server.log", "-o", f"-h 127.0.0.1 -p {port} -k {data}",
                 "-w", "-t", "60", "start"], timeout=90)
    try:
        server.port = port
        with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE jobsight")
        with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="jobsight", autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (v text)")
            conn.execute("INSERT INTO kept VALUES ('from before')")
        old = _psql(server, "127.0.0.1")  # any local user is the superuser: the hole this closes
        assert (old.returncode, old.stdout.strip()) == (0, "postgres"), old
        assert not server.password_file.exists()

        url = server.start()
        _assert_closed_to_others(server)
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT v FROM kept").fetchone() == ("from before",)
    finally:
        server.destroy()


def test_the_password_outlives_restarts_and_a_lost_one_is_replaced(tmp_path: Path) -> None:
    server = EmbeddedPostgres(tmp_path / "pg")
    try:
        first = server.start()
        server.stop()
        again = EmbeddedPostgres(tmp_path / "pg", port=server.port)
        assert again.start() == first
        with psycopg.connect(first) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        again.stop()
        # pgpass deleted: a new password, set at the next start; the old one no longer opens it.
        again.password_file.unlink()
        fresh = EmbeddedPostgres(tmp_path / "pg", port=server.port)
        renewed = fresh.start()
        assert renewed != first and fresh.password != server.password
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(first, connect_timeout=10)
        with psycopg.connect(renewed) as conn:
            assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
        _assert_closed_to_others(fresh)
    finally:
        server.destroy()


def test_jobsight_up_never_shows_the_password(tmp_path: Path, job_id: str) -> None:
    data_dir = tmp_path / "data"
    with Up(data_dir, tmp_path / "up.log", dashboard=False) as up:
        status, body, _ = _request(f"{up.url}/v1/ingest", up.token, _gpu_batch(job_id))
        assert (status, body["status"]) == (200, "stored")  # the collector got in, with the password
        password = (data_dir / "postgres" / "pgpass").read_text().strip().rsplit(":", 1)[1]
        assert len(password) >= 40
        # No process shows it in its command line, which every local user can read.
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    assert password.encode() not in (entry / "cmdline").read_bytes(), entry
                except OSError:
                    continue
        assert up.interrupt() == 0
    deadline = time.monotonic() + 10
    while "stopping jobsight" not in (tmp_path / "up.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    console = (tmp_path / "up.log").read_text()
    assert "jobsight is up" in console and "stopping jobsight" in console
    written = [tmp_path / "up.log", data_dir / "postgres" / "server.log", *sorted((data_dir / "logs").iterdir())]
    assert len(written) >= 3
    for path in written:
        assert password not in path.read_text(errors="replace"), path
