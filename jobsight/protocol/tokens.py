"""Job and node tokens: HMAC-SHA256 over a small JSON payload, signed with the cluster secret.

Format (three dot-separated parts, all URL-safe)::

    js1.<base64url(json payload)>.<base64url(hmac_sha256(secret, "js1." + payload part))>

The payload is ``{"kind": "job"|"node", "cluster": ..., "job": ... | "node": ...,
"iat": <unix s>, "exp": <unix s>}`` (a job token also carries ``"uid"`` when known).
Base64 is unpadded. The signature covers the version prefix and the payload exactly
as sent, so verifying never re-serialises JSON. Signatures are compared in constant
time. Standard library only: this module runs on every node (prolog, node daemon)
and in the collector.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

PREFIX: Final = "js1"
# Clocks on nodes and the collector drift a little; a token is not refused for
# being a few seconds early or late.
CLOCK_SKEW_S: Final = 60
DEFAULT_GRACE_S: Final = 3600
NODE_TOKEN_TTL_S: Final = 7 * 86400
DEFAULT_SECRET_FILE: Final = "/etc/jobsight/cluster_secret"
# A node token is minted again when this much of its life is left, well before it expires.
NODE_TOKEN_RENEW_FRACTION: Final = 1 / 3

log = logging.getLogger("jobsight.tokens")


class TokenError(ValueError):
    """A token that cannot be used; ``reason`` is ``malformed``, ``bad signature``,
    ``expired`` or ``not yet valid`` and the message says it in words (never the token)."""

    def __init__(self, reason: str, message: str | None = None):
        super().__init__(message or reason)
        self.reason = reason


@dataclass(frozen=True)
class TokenClaims:
    kind: Literal["job", "node"]
    cluster: str
    subject: str
    """The job id for a job token, the node name for a node token."""
    issued_at: int
    expires_at: int
    uid: int | None = None
    """The job's uid (job tokens minted by the prolog); ``None`` when not recorded."""

    @property
    def job(self) -> str | None:
        return self.subject if self.kind == "job" else None

    @property
    def node(self) -> str | None:
        return self.subject if self.kind == "node" else None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not text or any(c not in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_" for c in text):
        raise TokenError("malformed", "token is malformed (not base64url)")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise TokenError("malformed", "token is malformed (not base64url)") from exc


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _key(secret: str | bytes) -> bytes:
    raw = secret.encode() if isinstance(secret, str) else secret
    if not raw.strip():
        raise ValueError("the cluster secret is empty")
    return raw.strip()


def _sign(secret: str | bytes, signed_part: str) -> bytes:
    return hmac.new(_key(secret), signed_part.encode("ascii"), hashlib.sha256).digest()


def _mint(secret: str | bytes, payload: dict[str, Any]) -> str:
    body = _b64(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode())
    signed = f"{PREFIX}.{body}"
    return f"{signed}.{_b64(_sign(secret, signed))}"


def mint_job_token(
    secret: str | bytes,
    cluster: str,
    job: str,
    ttl_s: int,
    *,
    uid: int | None = None,
    now: float | None = None,
) -> str:
    """A token that may write (and read) records of ``job`` only, valid ``ttl_s`` seconds.

    The prolog passes the job's time limit plus a grace period as ``ttl_s``.
    """
    issued = int(time.time() if now is None else now)
    payload: dict[str, Any] = {"kind": "job", "cluster": cluster, "job": job, "iat": issued, "exp": issued + int(ttl_s)}
    if uid is not None:
        payload["uid"] = uid
    return _mint(secret, payload)


def mint_node_token(
    secret: str | bytes, cluster: str, node: str, ttl_s: int = NODE_TOKEN_TTL_S, *, now: float | None = None
) -> str:
    """A token for the node daemon and the root hooks of ``node``: GPU/host samples of jobs
    registered on that node, and those jobs' start and end records."""
    issued = int(time.time() if now is None else now)
    return _mint(secret, {"kind": "node", "cluster": cluster, "node": node, "iat": issued, "exp": issued + int(ttl_s)})


def verify_token(secret: str | bytes, token: str, now: float | None = None) -> TokenClaims:
    """Check the signature and the expiry; returns the claims or raises :class:`TokenError`."""
    parts = token.strip().split(".")
    if len(parts) != 3 or parts[0] != PREFIX:
        raise TokenError("malformed", f"token is malformed (expected {PREFIX}.<payload>.<signature>)")
    signature = _unb64(parts[2])
    expected = _sign(secret, f"{parts[0]}.{parts[1]}")
    if not hmac.compare_digest(signature, expected):
        raise TokenError("bad signature", "token signature does not match this cluster's secret")
    try:
        payload = json.loads(_unb64(parts[1]))
    except (ValueError, UnicodeDecodeError) as exc:
        raise TokenError("malformed", "token payload is not JSON") from exc
    if not isinstance(payload, dict):
        raise TokenError("malformed", "token payload is not an object")
    kind = payload.get("kind")
    cluster = payload.get("cluster")
    subject = payload.get("job") if kind == "job" else payload.get("node") if kind == "node" else None
    issued, expires, uid = payload.get("iat"), payload.get("exp"), payload.get("uid")
    if kind not in ("job", "node"):
        raise TokenError("malformed", "token kind is neither job nor node")
    if not isinstance(cluster, str) or not cluster or not isinstance(subject, str) or not subject:
        raise TokenError("malformed", f"{kind} token lacks its cluster or {kind}")
    if not (_is_int(issued) and _is_int(expires)):
        raise TokenError("malformed", "token times are not integers")
    assert isinstance(issued, int) and isinstance(expires, int)
    if uid is not None and (not isinstance(uid, int) or isinstance(uid, bool)):
        raise TokenError("malformed", "token uid is not an integer")
    current = time.time() if now is None else now
    if current > expires + CLOCK_SKEW_S:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))
        raise TokenError("expired", f"{kind} token expired at {when}")
    if current < issued - CLOCK_SKEW_S:
        raise TokenError("not yet valid", f"{kind} token is issued in the future (clock skew?)")
    return TokenClaims(kind, cluster, subject, issued, expires, uid)


def looks_like_token(token: str) -> bool:
    """Whether ``token`` has this module's shape (so the collector can say which check failed)."""
    return token.startswith(PREFIX + ".")


def read_cluster_secret(path: str) -> bytes:
    """The cluster secret in ``path``, stripped. Raises ``OSError`` when it cannot be read
    and ``ValueError`` when it is empty."""
    with open(path, "rb") as handle:
        secret = handle.read().strip()
    if not secret:
        raise ValueError(f"the cluster secret {path} is empty")
    return secret


class NodeTokenSource:
    """Mints a node's ingest token from the cluster secret, when it can.

    Without a readable secret file :meth:`token` is ``None`` (or the last token minted).
    The token is minted again when a third of its life is left.
    """

    def __init__(
        self,
        secret_file: str,
        cluster: str,
        node: str,
        ttl_s: int = NODE_TOKEN_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.secret_file = secret_file
        self.cluster = cluster
        self.node = node
        self.ttl_s = ttl_s
        self._clock = clock
        self._renew_at = 0.0
        self._current: str | None = None
        self._warned = False

    def _secret(self) -> bytes | None:
        try:
            info = os.stat(self.secret_file)
            secret = read_cluster_secret(self.secret_file)
        except (OSError, ValueError):
            return None
        if info.st_mode & stat.S_IRWXO and not self._warned:
            self._warned = True
            log.warning("jobsight: the cluster secret %s is readable by every user; chmod 600 it", self.secret_file)
        return secret

    def token(self) -> str | None:
        """The current node token, minted again when due; ``None`` when none can be minted."""
        now = self._clock()
        if self._current is not None and now < self._renew_at:
            return self._current
        secret = self._secret()
        if secret is None:
            return self._current
        self._current = mint_node_token(secret, self.cluster, self.node, self.ttl_s)
        self._renew_at = now + self.ttl_s * (1 - NODE_TOKEN_RENEW_FRACTION)
        return self._current
