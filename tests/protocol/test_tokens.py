"""Job and node tokens (jobsight/protocol/tokens.py): round trip, and every way a token is refused."""

from __future__ import annotations

import base64
import json

import pytest

from jobsight.protocol.tokens import TokenError, mint_job_token, mint_node_token, verify_token

SECRET = "s3cret-cluster-key"
NOW = 1_763_769_600


def test_job_token_round_trip() -> None:
    token = mint_job_token(SECRET, "hpc", "123", 3600, uid=1001, now=NOW)
    assert token.startswith("js1.") and token.count(".") == 2
    claims = verify_token(SECRET, token, now=NOW + 10)
    assert (claims.kind, claims.cluster, claims.job, claims.node, claims.uid) == ("job", "hpc", "123", None, 1001)
    assert claims.expires_at == NOW + 3600


def test_node_token_round_trip() -> None:
    claims = verify_token(SECRET.encode(), mint_node_token(SECRET.encode(), "hpc", "gpu01", now=NOW), now=NOW)
    assert (claims.kind, claims.node, claims.job) == ("node", "gpu01", None)


def test_secret_whitespace_is_ignored() -> None:
    """The secret file's trailing newline must not change the key."""
    token = mint_job_token(SECRET + "\n", "hpc", "1", 60, now=NOW)
    verify_token(SECRET, token, now=NOW)


def test_expired_token_is_refused_with_the_reason() -> None:
    token = mint_job_token(SECRET, "hpc", "123", 3600, now=NOW)
    verify_token(SECRET, token, now=NOW + 3600 + 59)  # within the clock-skew allowance
    with pytest.raises(TokenError) as caught:
        verify_token(SECRET, token, now=NOW + 3600 + 61)
    assert caught.value.reason == "expired" and "expired" in str(caught.value)


def test_future_token_is_refused() -> None:
    token = mint_job_token(SECRET, "hpc", "123", 3600, now=NOW + 1000)
    with pytest.raises(TokenError) as caught:
        verify_token(SECRET, token, now=NOW)
    assert caught.value.reason == "not yet valid"


def test_other_secret_is_a_bad_signature() -> None:
    token = mint_job_token("another-secret", "hpc", "123", 3600, now=NOW)
    with pytest.raises(TokenError) as caught:
        verify_token(SECRET, token, now=NOW)
    assert caught.value.reason == "bad signature"


def test_forged_payload_is_a_bad_signature() -> None:
    """Changing the job in the payload (keeping the signature) must not verify."""
    prefix, payload, signature = mint_job_token(SECRET, "hpc", "123", 3600, now=NOW).split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims["job"] = "999"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    with pytest.raises(TokenError) as caught:
        verify_token(SECRET, f"{prefix}.{forged}.{signature}", now=NOW)
    assert caught.value.reason == "bad signature"


@pytest.mark.parametrize(
    "token",
    ["", "js1", "js1.abc", "js2.abc.def", "js1.abc.def.ghi", "js1.a b.c", "js1.!!.??", "jsa_admin"],
)
def test_malformed_tokens(token: str) -> None:
    with pytest.raises(TokenError) as caught:
        verify_token(SECRET, token, now=NOW)
    assert caught.value.reason in ("malformed", "bad signature")


def test_signed_garbage_payload_is_malformed() -> None:
    """A payload that is validly signed but not a token's shape is refused as malformed."""
    import hashlib
    import hmac

    body = base64.urlsafe_b64encode(b'{"kind":"admin"}').rstrip(b"=").decode()
    sig = hmac.new(SECRET.encode(), f"js1.{body}".encode(), hashlib.sha256).digest()
    token = f"js1.{body}.{base64.urlsafe_b64encode(sig).rstrip(b'=').decode()}"
    with pytest.raises(TokenError) as caught:
        verify_token(SECRET, token, now=NOW)
    assert caught.value.reason == "malformed"


def test_empty_secret_cannot_mint() -> None:
    with pytest.raises(ValueError):
        mint_job_token("  ", "hpc", "1", 60)


def test_token_error_never_contains_the_token() -> None:
    token = mint_job_token("other", "hpc", "123", 3600, now=NOW)
    with pytest.raises(TokenError) as caught:
        verify_token(SECRET, token, now=NOW)
    assert token not in str(caught.value) and token.split(".")[2] not in str(caught.value)
