"""How every answer of the collector is judged, for every sender: the shipper's client
(:mod:`jobsight.agent.shipping.client`) and the Slurm hooks' lean socket path
(:mod:`jobsight.agent.slurm.sender`). Kept apart from the client so a hook does not pay
for importing ``http.client``.

* ``ack``: 2xx (for a batch: ``stored`` or ``duplicate``);
* ``reject``: a 4xx the collector will always give for this request; never retried;
* ``retry``: 5xx, 408, 429 or no answer at all (status 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

INGEST_PATH: Final = "/v1/ingest"
"""Where batches are posted, under the collector URL's path."""

ACK: Final = "ack"
REJECT: Final = "reject"
RETRY: Final = "retry"


def judge_status(status: int) -> str:
    """:data:`ACK`, :data:`REJECT` or :data:`RETRY` for an HTTP status (0: no answer came)."""
    if 200 <= status < 300:
        return ACK
    if 400 <= status < 500 and status not in (408, 429):
        return REJECT
    return RETRY


@dataclass(frozen=True)
class Outcome:
    kind: str
    """:data:`ACK`, :data:`REJECT` or :data:`RETRY`."""
    status: int = 0
    """The HTTP status; 0 when no answer came."""
    detail: str = ""
    retry_after: float | None = None
    """Seconds from ``Retry-After``; ``None`` when absent or unreadable."""
