"""Who may write and read. One check for every request; the Slurm integration adds
job and node tokens to it.

Only a SHA-256 of the admin token is kept in memory, and tokens are compared in
constant time. No token is ever logged.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agent.wire import Batch


class AuthError(Exception):
    """A request without the right to do what it asks; ``status`` is 401 or 403."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Principal:
    kind: Literal["admin", "job", "node"]
    job: str | None = None
    node: str | None = None
    cluster: str | None = None


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def ensure_admin_token(path: Path) -> str:
    """Read the admin token, creating it (mode 0600) when absent; returns it."""
    if path.exists():
        return path.read_text(encoding="utf-8").strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    token = "jsa_" + secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(token + "\n")
    return token


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


class Authenticator:
    def __init__(self, admin_tokens: list[str]):
        self._admin = [_digest(t) for t in admin_tokens if t]

    def authenticate(self, authorization: str | None) -> Principal:
        if not authorization:
            raise AuthError(401, "missing bearer token")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthError(401, "expected 'Authorization: Bearer <token>'")
        digest = _digest(token.strip())
        if any(hmac.compare_digest(digest, admin) for admin in self._admin):
            return Principal("admin")
        raise AuthError(401, "unknown token")

    def authorize_batch(self, principal: Principal, batch: Batch) -> None:
        """Raise :class:`AuthError` if ``principal`` may not write every record of ``batch``."""
        if principal.kind == "admin":
            return
        raise AuthError(403, f"a {principal.kind} token cannot write this batch")

    def authorize_read(self, principal: Principal, job: str | None = None) -> None:
        if principal.kind == "admin":
            return
        if principal.kind == "job" and job is not None and job == principal.job:
            return
        raise AuthError(403, "this token cannot read that")
