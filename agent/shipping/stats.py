"""The shipper's counters, kept by its queue (drops) and its delivery (the rest)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ShipperStats:
    sent_batches: int = 0
    sent_records: int = 0
    """Records in acknowledged batches, replays included."""
    spooled_batches: int = 0
    replayed_batches: int = 0
    dropped_records: int = 0
    rejected_batches: int = 0
    """Batches the collector refused (4xx)."""
    quarantined_batches: int = 0
    """Batches set aside after failing the same way too long (:mod:`jobsight.agent.shipping.poison`)."""
    duplicate_batches: int = 0
