"""Where the shipper keeps batches the collector has not acknowledged: the protocol and the in-memory store.

:class:`jobsight.agent.shipping.spool.Spool` is the disk store; :class:`MemorySpool` stands in for it
when no spool directory can be used (or ``use_spool=False``).
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from jobsight.agent.shipping.spool_format import SpooledBatch


class BatchStore(Protocol):
    """What the shipper needs from a spool: :class:`~jobsight.agent.shipping.spool.Spool` on disk,
    :class:`MemorySpool` without one."""

    def append(self, source: str, seq: int, records: int, body: bytes) -> bool: ...
    def peek(self) -> SpooledBatch | None: ...
    def ack(self) -> None: ...
    def reject(self, batch: SpooledBatch, status: int, detail: str, quarantined: str | None = None) -> None: ...
    def set_aside(self, batch: SpooledBatch, status: int, detail: str, quarantined: str | None = None) -> None: ...
    def pending(self) -> int: ...
    def adopt(self) -> int: ...
    def sync(self) -> None: ...
    def close(self) -> None: ...
    def abandon(self) -> None: ...


class MemorySpool:
    """The fallback when the spool directory cannot be used: same contract, lost at exit."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: deque[SpooledBatch] = deque()
        self._bytes = 0

    def append(self, source: str, seq: int, records: int, body: bytes) -> bool:
        if self._bytes + len(body) > self.max_bytes:
            return False
        self._items.append(SpooledBatch(source, seq, records, body))
        self._bytes += len(body)
        return True

    def peek(self) -> SpooledBatch | None:
        return self._items[0] if self._items else None

    def ack(self) -> None:
        if self._items:
            self._bytes -= len(self._items.popleft().body)

    def reject(self, batch: SpooledBatch, status: int, detail: str, quarantined: str | None = None) -> None:
        self.ack()

    def set_aside(self, batch: SpooledBatch, status: int, detail: str, quarantined: str | None = None) -> None:
        pass

    def pending(self) -> int:
        return len(self._items)

    def adopt(self) -> int:
        return 0

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abandon(self) -> None:
        self._items.clear()
        self._bytes = 0
