"""Who is calling, and what they may read. One check for every request.

Three kinds of bearer token: **admin** (``<data_dir>/admin_token``), everything; **job** (minted by
the Slurm prolog with the cluster secret, :mod:`jobsight.protocol.tokens`), reads its own job (and,
once a prolog registered the job with its uid, only a token minted for that uid counts:
:func:`~jobsight.collector.ingest.write_rights.check_job_owner`); **node** (minted by the node daemon
and the root hooks), cannot read. What each may write is the ingest room's
(:mod:`jobsight.collector.ingest.write_rights`), which also holds :class:`Principal` and
:class:`AuthError`, so that the ingest path judges a batch without importing this room.

Job and node tokens are accepted only when the collector has a cluster secret
(``JOBSIGHT_SECRET_FILE``, default ``<data_dir>/cluster_secret``); without one they get 401 saying so.
Only a SHA-256 of the admin token is kept in memory, and tokens are compared in constant time. No
token is ever logged.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
from pathlib import Path

from jobsight.collector.ingest.write_rights import AuthError, Principal
from jobsight.protocol.tokens import TokenError, looks_like_token, verify_token

log = logging.getLogger("jobsight.collector")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def ensure_admin_token(path: Path) -> str:
    """Read the admin token, creating it (mode 0600) when absent; returns it."""
    if path.exists():
        return path.read_text(encoding="utf-8").strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    token = "jsa_" + secrets.token_urlsafe(32)
    # Written whole under a private name, then linked into place: with --workers N every
    # process starts here at once, and each must end with the one token that won, never a
    # half-written file or a start-up crash on the loser's side.
    draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(token + "\n")
        os.link(draft, path)
    except FileExistsError:
        return path.read_text(encoding="utf-8").strip()
    finally:
        draft.unlink(missing_ok=True)
    return token


def ensure_cluster_secret(path: Path) -> bool:
    """Create the cluster secret (mode 0600, 32 random bytes as hex) when ``path`` does not
    exist; returns whether it was created. An existing file is left as it is, to be judged
    by :func:`load_cluster_secret` at start-up. The secret is never logged."""
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # O_EXCL: two starts racing must not write two secrets, one of them to tokens already minted.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(secrets.token_hex(32) + "\n")
    log.info("created the cluster secret %s", path)
    return True


def read_secret_file(path: Path, what: str) -> str:
    """Read a secret, refusing one that other users can read (the message says which file)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError as exc:
        raise RuntimeError(f"{what} {path} does not exist") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise RuntimeError(f"{what} {path} is readable by other users (mode {stat.S_IMODE(mode):o}); chmod 600 it")
    value = path.read_text(encoding="utf-8").strip()
    if not value:
        raise RuntimeError(f"{what} {path} is empty")
    return value


def load_cluster_secret(path: Path) -> str | None:
    """The cluster secret, or ``None`` (logged) when the file does not exist.

    Raises ``RuntimeError`` naming the file when it is readable by other users or
    empty: the collector must not start on a leaked secret.
    """
    if not path.exists():
        log.warning("no cluster secret at %s: job and node tokens will not be accepted "
                    "(set JOBSIGHT_SECRET_FILE to enable the Slurm integration)", path)
        return None
    return read_secret_file(path, "cluster secret")


class Authenticator:
    """``admin_tokens``: accepted admin tokens; ``secret``: the cluster secret for job and
    node tokens (``None``: only admin tokens work)."""

    def __init__(self, admin_tokens: list[str], secret: str | None = None):
        self._admin = [_digest(t) for t in admin_tokens if t]
        self._secret = secret

    def authenticate(self, authorization: str | None, now: float | None = None) -> Principal:
        if not authorization:
            raise AuthError(401, "missing bearer token")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthError(401, "expected 'Authorization: Bearer <token>'")
        digest = _digest(token)
        if any(hmac.compare_digest(digest, admin) for admin in self._admin):
            return Principal("admin")
        if not looks_like_token(token):
            raise AuthError(401, "unknown token")
        if self._secret is None:
            raise AuthError(401, "this collector has no cluster secret, so it accepts no job or node tokens")
        try:
            claims = verify_token(self._secret, token, now)
        except TokenError as exc:
            raise AuthError(401, str(exc)) from exc
        return Principal(claims.kind, job=claims.job, node=claims.node, cluster=claims.cluster, uid=claims.uid)

    def authorize_read(self, principal: Principal, job: str | None = None, cluster: str | None = None) -> None:
        """Raise :class:`AuthError` unless ``principal`` may read ``job`` of ``cluster``
        (``job=None``: the job list; ``cluster=None``: the caller did not resolve one)."""
        if principal.kind == "admin":
            return
        same_cluster = cluster is None or cluster == principal.cluster
        if principal.kind == "job" and job is not None and job == principal.job and same_cluster:
            return
        if principal.kind == "job":
            raise AuthError(403, f"a job token of job {principal.job} can read only that job")
        raise AuthError(403, "a node token cannot read")
