"""The one client of the collector's profiling directives, for the training hooks and the node daemon.

A job's open profile requests come from ``GET /v1/directives?job=…[&rank=…]``: the in-process
poller asks for its own rank (:mod:`jobsight.agent.training.directives`), the node daemon's Kineto
service for every rank of a job whose processes poll it (:mod:`jobsight.agent.node.kineto.directive_poll`).
Each reports what became of a request with ``POST /v1/profile-requests/{id}/state`` (``running``,
``failed``); ``done`` is set by the collector itself when the profile carrying the request id is stored.

A request the answer holds in a shape not understood is skipped, never raised: a newer collector
may send more than this agent reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobsight.agent.shipping.client import CollectorClient

DIRECTIVES_PATH = "/v1/directives"


@dataclass(frozen=True)
class ProfileRequest:
    """A job's request for a profile of ``steps`` steps."""

    id: int
    steps: int
    ranks: tuple[int, ...] | None
    """``None`` means every rank."""


def parse_profile_requests(body: Any) -> list[ProfileRequest]:
    """The profile requests of a directives answer, in its order; those not understood left out."""
    if not isinstance(body, dict):
        return []
    items = body.get("profile_requests", [])
    if not isinstance(items, list):
        return []
    found: list[ProfileRequest] = []
    for item in items:
        try:
            ranks = item.get("ranks")
            found.append(ProfileRequest(int(item["id"]), int(item["steps"]),
                                        tuple(int(r) for r in ranks) if ranks is not None else None))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return found


def fetch_profile_requests(client: CollectorClient, job: str,
                           rank: int | None = None) -> tuple[int, list[ProfileRequest]]:
    """``(HTTP status, the job's open requests)``, those addressed to ``rank`` where given; status 0
    when the collector could not be reached, and no requests unless the status is 200."""
    query = {"job": job}
    if rank is not None:
        query["rank"] = str(rank)
    answer = client.request("GET", DIRECTIVES_PATH, query=query)
    return answer.status, parse_profile_requests(answer.json()) if answer.status == 200 else []


def post_request_state(client: CollectorClient, request_id: int, state: str, reason: str | None = None) -> int:
    """Report what became of a profile request; the HTTP status (0: the collector could not be reached)."""
    answer = client.post_json(f"/v1/profile-requests/{request_id}/state", {"state": state, "reason": reason})
    return answer.status
