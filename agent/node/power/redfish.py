"""The whole node's power from its BMC over Redfish (HTTPS), for ``JOBSIGHT_POWER_SOURCE=redfish``.

The reading is the chassis' ``Power`` resource, ``PowerControl[0].PowerConsumedWatts``; a BMC that
has dropped that (deprecated) resource for DMTF's newer schema is read from the chassis'
``EnvironmentMetrics``, ``PowerWatts.Reading``. The chassis is the configured one or the first
member of ``/redfish/v1/Chassis`` (discovered once): on a BMC with several chassis (HGX baseboards,
enclosures) the site names the one that holds the node's power.

Everything that goes wrong is a :class:`~jobsight.agent.node.power.reader.PowerReadError` with a short
message for the agent's log, read by :class:`~jobsight.agent.node.power.reader.BackgroundPowerReader`
on its own thread: a BMC that hangs costs that thread, never the tick.

Credentials: the BMC's user and password are HTTP Basic auth from a root-only file whose first
line is ``user:password`` (split at the first colon, so the password may hold colons; a trailing
newline is dropped, nothing else is stripped). The file is read on every reading, so a rotated
password is taken up without a restart. The password is never put in a message, a log line or an
exception: every error names the file instead. Credentials in the URL are refused for that reason.
The file must be root's (or the daemon's user's) and closed to group and others
(:mod:`jobsight.agent.node.power.credential_files`), checked on the open file at each reading.

The BMC's certificate is always verified, against ``ca_file`` when given (BMCs mostly carry a
site's own CA or a self-signed certificate) and the system's CAs otherwise; ``insecure=True``
turns verification off, explicitly, and says so in the log when the reader is made.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import math
import os
import ssl
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Final

from jobsight.agent.node.power.credential_files import UnsafeCredentialFile, check_credential_stat
from jobsight.agent.node.power.reader import PowerReadError

log = logging.getLogger("jobsight.agent.power")

MAX_ANSWER_BYTES: Final = 1 << 20
"""The most of one answer that is read: a Power resource is a few KiB, a broken BMC must not eat memory."""
_CHUNK: Final = 64 << 10
_REASON_CHARS: Final = 80  # of the BMC's HTTP reason phrase, in a message


@dataclass(frozen=True)
class RedfishTarget:
    """Where and how to read one node's BMC.

    ``url``: the BMC's base, ``https://host[:port]`` (no path, no credentials).
    ``credentials_file``: first line ``user:password`` (see the module's docstring); ``None``
    sends no credentials (a BMC that allows anonymous reads).
    ``ca_file``: the CA bundle (PEM) that signed the BMC's certificate; ``None``: the system's CAs.
    ``chassis``: the Chassis id (``1``, ``System.Embedded.1``); ``None``: the first member.
    ``timeout_s``: the wait for the connection, and for each part of an answer.
    ``insecure``: do not verify the BMC's certificate (explicit, and logged).
    """

    url: str
    credentials_file: str | None
    ca_file: str | None = None
    chassis: str | None = None
    timeout_s: float = 5.0
    insecure: bool = False

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme != "https":
            raise ValueError("the Redfish URL must be https:// (the BMC's password travels with every request)")
        if parts.username is not None or parts.password is not None:
            # The URL is in every error message; a password in it would be too.
            raise ValueError("credentials belong in credentials_file, not in the Redfish URL")
        if not parts.hostname:
            raise ValueError("the Redfish URL has no host")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError("the Redfish URL is the BMC's base (https://host[:port]), without a path")
        if not self.timeout_s > 0:
            raise ValueError("timeout_s must be positive")
        if self.insecure and self.ca_file is not None:
            raise ValueError("ca_file and insecure contradict each other: verify against ca_file, or not at all")


class RedfishReader:
    """Reads the node's watts from the BMC of a :class:`RedfishTarget`; one request per reading
    once the chassis and its resource are known. Not thread-safe: one reader thread calls it."""

    def __init__(self, target: RedfishTarget) -> None:
        self.target = target
        parts = urllib.parse.urlsplit(target.url)
        self._host: str = parts.hostname or ""
        self._port: int = parts.port or 443  # explicit: http.client would read an IPv6 host's last group as one
        self._base = target.url.rstrip("/")
        self._context: ssl.SSLContext | None = None
        self._chassis_path: str | None = (
            None if target.chassis is None
            else "/redfish/v1/Chassis/" + urllib.parse.quote(target.chassis, safe=""))
        self._environment_metrics = False
        """The chassis has no ``Power`` (404) and is read from ``EnvironmentMetrics``."""
        if target.insecure:
            log.warning("jobsight agent: the certificate of the BMC at %s is NOT verified (insecure is set)",
                        target.url)

    def power_w(self) -> float:
        """The node's power in watts, as the BMC reports it now. Raises :class:`PowerReadError`."""
        auth = self._authorization()
        chassis = self._chassis(auth)
        if not self._environment_metrics:
            doc = self._get(f"{chassis}/Power", auth)
            if doc is not None:
                return _power_control_watts(doc, f"{chassis}/Power")
        doc = self._get(f"{chassis}/EnvironmentMetrics", auth)
        if doc is None:
            self._forget()
            raise PowerReadError(f"{self._base}{chassis} has neither Power nor EnvironmentMetrics (HTTP 404)")
        watts = _environment_watts(doc, f"{chassis}/EnvironmentMetrics")
        self._environment_metrics = True
        return watts

    def _forget(self) -> None:
        """A resource went missing: find the chassis (when discovered) and its resource again next time."""
        self._environment_metrics = False
        if self.target.chassis is None:
            self._chassis_path = None

    def _chassis(self, auth: str | None) -> str:
        if self._chassis_path is None:
            doc = self._get("/redfish/v1/Chassis", auth)
            if doc is None:
                raise PowerReadError(f"{self._base} has no /redfish/v1/Chassis (HTTP 404)")
            members = doc.get("Members")
            first = members[0] if isinstance(members, list) and members else None
            path = first.get("@odata.id") if isinstance(first, dict) else None
            if not isinstance(path, str) or not path.startswith("/"):
                raise PowerReadError(f"{self._base}/redfish/v1/Chassis lists no chassis")
            self._chassis_path = path.rstrip("/")
        return self._chassis_path

    def _authorization(self) -> str | None:
        """The ``Authorization`` header from the credentials file, read now (it may have been rotated)."""
        name = self.target.credentials_file
        if name is None:
            return None
        try:
            with open(name, "rb") as handle:
                # The file as opened, not its path again: what is checked is what is read.
                check_credential_stat(name, os.fstat(handle.fileno()))
                raw = handle.readline(4096)
        except OSError as exc:
            raise PowerReadError(f"cannot read the BMC credentials file {name}: {exc.strerror or type(exc).__name__}") \
                from None
        except UnsafeCredentialFile as exc:
            raise PowerReadError(f"not using the BMC credentials file: {exc}") from None
        try:
            line = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            # The exception holds the file's bytes: not chained, not shown.
            raise PowerReadError(f"the BMC credentials file {name} is not UTF-8") from None
        user, colon, _ = line.partition(":")
        if not colon or not user:
            raise PowerReadError(f"the BMC credentials file {name} does not start with a user:password line")
        return "Basic " + base64.b64encode(line.encode("utf-8")).decode("ascii")

    def _ssl_context(self) -> ssl.SSLContext:
        if self._context is None:
            try:
                context = ssl.create_default_context(cafile=self.target.ca_file)
            except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                raise PowerReadError(f"cannot load the BMC's CA file {self.target.ca_file}: "
                                     f"{getattr(exc, 'strerror', None) or exc}") from None
            if self.target.insecure:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            self._context = context
        return self._context

    def _get(self, path: str, auth: str | None) -> dict[str, Any] | None:
        """``GET path`` as a JSON object; ``None`` when the BMC has no such resource (404)."""
        where = f"{self._base}{path}"
        headers = {"Accept": "application/json", "OData-Version": "4.0", "User-Agent": "jobsight-agent"}
        if auth is not None:
            headers["Authorization"] = auth
        timeout = self.target.timeout_s
        deadline = time.monotonic() + timeout
        connection = http.client.HTTPSConnection(self._host, self._port, timeout=timeout,
                                                 context=self._ssl_context())
        try:
            connection.request("GET", path, headers=headers)
            response = connection.getresponse()
            status = response.status
            if status in (401, 403):
                if self.target.credentials_file is None:
                    raise PowerReadError(f"the BMC at {self._base} wants credentials and none are configured "
                                         f"(HTTP {status})", refused=True)
                raise PowerReadError(f"the BMC at {self._base} refused the credentials in "
                                     f"{self.target.credentials_file} (HTTP {status})", refused=True)
            if status == 404:
                return None
            if status != 200:
                reason = response.reason[:_REASON_CHARS]
                raise PowerReadError(f"HTTP {status} {reason} from {where}")
            body = _read_bounded(response, deadline, where)
        except ssl.SSLCertVerificationError as exc:
            raise PowerReadError(f"TLS certificate of {self._base} not trusted: {exc.verify_message}"
                                 + ("" if self.target.ca_file is None else f" (CA file {self.target.ca_file})")) \
                from None
        except ssl.SSLError as exc:
            raise PowerReadError(f"TLS with {self._base} failed: {exc.reason or exc}") from None
        except TimeoutError:
            raise PowerReadError(f"no answer from {where} in {timeout:g} s") from None
        except ConnectionRefusedError:
            raise PowerReadError(f"connection to {self._base} refused") from None
        except OSError as exc:  # unreachable, reset, no such host
            raise PowerReadError(f"cannot reach {self._base}: {exc.strerror or type(exc).__name__}") from None
        except http.client.HTTPException as exc:  # a broken answer: no status line, cut short
            raise PowerReadError(f"broken HTTP answer from {where}: {type(exc).__name__}") from None
        finally:
            connection.close()
        try:
            doc = json.loads(body)
        except ValueError:  # not UTF-8 or not JSON
            raise PowerReadError(f"{where} answered with something that is not JSON") from None
        if not isinstance(doc, dict):
            raise PowerReadError(f"{where} answered with JSON that is not an object")
        return doc


def _read_bounded(response: http.client.HTTPResponse, deadline: float, where: str) -> bytes:
    """The body, at most :data:`MAX_ANSWER_BYTES`, and within the request's deadline: each wait for
    bytes is bounded by the socket's timeout, a BMC that drips them is bounded here."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = response.read1(_CHUNK)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise PowerReadError(f"{where} answered with more than {MAX_ANSWER_BYTES >> 20} MiB")
        chunks.append(chunk)
        if time.monotonic() > deadline:
            raise TimeoutError


def _number(value: object, what: str) -> float:
    if value is None:
        raise PowerReadError(f"{what} is missing")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PowerReadError(f"{what} is {str(value)[:40]!r}, not a number")
    watts = float(value)
    if not math.isfinite(watts):
        raise PowerReadError(f"{what} is {watts!r}")
    return watts


def _power_control_watts(doc: dict[str, Any], path: str) -> float:
    controls = doc.get("PowerControl")
    first = controls[0] if isinstance(controls, list) and controls else None
    if not isinstance(first, dict):
        raise PowerReadError(f"{path} has no PowerControl")
    return _number(first.get("PowerConsumedWatts"), f"{path} PowerControl[0].PowerConsumedWatts")


def _environment_watts(doc: dict[str, Any], path: str) -> float:
    power = doc.get("PowerWatts")
    if not isinstance(power, dict):
        raise PowerReadError(f"{path} has no PowerWatts")
    return _number(power.get("Reading"), f"{path} PowerWatts.Reading")
