"""Delivery of encoded batches: straight to the collector, or through the spool while it is away.

* 200 (``stored`` or ``duplicate``) acknowledges a batch;
* 4xx: the collector will never take it; it is logged once per status and kept
  in the spool's ``rejected/`` folder, and the batches after it go on;
* 5xx, 429 or a network error: backoff (see :mod:`jobsight.agent.shipping.client`); the
  batch and every batch after it go to the disk spool, which is replayed in
  order, with each batch's original ``(source, seq)``, once the collector
  answers again. Segments left by a dead process on this node are adopted and
  replayed too.
* but a batch that keeps getting the same non-transient answer (a 500 for that
  batch) is quarantined by the rule of :mod:`jobsight.agent.shipping.poison`: kept
  in ``rejected/`` too, its records reported as dropped, and the rest flows.

Used from the shipper's worker thread only; a forked child makes its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Final

from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.batch_store import BatchStore, MemorySpool
from jobsight.agent.shipping.client import CollectorClient
from jobsight.agent.shipping.outcomes import ACK, RETRY, Outcome
from jobsight.agent.shipping.poison import PoisonWatch, records_of
from jobsight.agent.shipping.spool import Spool
from jobsight.agent.shipping.spool_format import SpooledBatch
from jobsight.agent.shipping.stats import ShipperStats

log = logging.getLogger("jobsight.agent.shipper")

ADOPT_INTERVAL_S: Final = 30.0


class Delivery:
    """Sends or stores each batch, in order, and replays the store.

    ``settle(n)`` is called when ``n`` of this process's (``source``'s) records are
    done with: acknowledged, refused or quarantined. Batches adopted from other
    processes are not counted. ``report_drops(records, reason)`` counts the records
    of a quarantined batch (ours or adopted) for a ``dropped`` report.
    """

    def __init__(
        self,
        settings: AgentSettings,
        client: CollectorClient,
        stats: ShipperStats,
        *,
        source: str,
        settle: Callable[[int], None],
        report_drops: Callable[[list[dict[str, Any]], str], None],
        use_spool: bool,
    ) -> None:
        self.settings = settings
        self.client = client
        self.stats = stats
        self.source = source
        self._settle = settle
        self._report_drops = report_drops
        self._use_spool = use_spool
        self.poison = PoisonWatch(settings.poison_tries, settings.poison_after_s)
        self.store: BatchStore | None = None
        """``None`` until :meth:`open` (on the worker thread)."""
        self._next_adopt = 0.0
        self._logged: set[str] = set()

    def open(self) -> None:
        self.store = self._open_store()

    def _open_store(self) -> BatchStore:
        if self._use_spool:
            try:
                spool = Spool(self.settings.resolved_spool_dir(), self.settings.spool_max_bytes)
                spool.adopt()
                self._next_adopt = time.monotonic() + ADOPT_INTERVAL_S
                return spool
            except OSError as exc:
                log.warning("jobsight: no disk spool (%s); unsent batches are kept in memory", exc)
        return MemorySpool(self.settings.spool_max_bytes)

    def waits(self, now: float) -> list[float]:
        """Seconds until delivery has something to do: a backoff ends, or adoption is due."""
        waits: list[float] = []
        store = self.store
        if store is not None and store.pending():
            waits.append(self.client.backoff_until - now)
        if self._use_spool:
            waits.append(self._next_adopt - now)
        return waits

    def adopt_if_due(self) -> None:
        store = self.store
        assert store is not None
        if self._use_spool and time.monotonic() >= self._next_adopt:
            store.adopt()
            self._next_adopt = time.monotonic() + ADOPT_INTERVAL_S

    def send(self, batch: SpooledBatch, *, past_deadline: bool) -> bool:
        """Post ``batch`` or store it behind the backlog; ``False`` when it could be neither
        (the store is full): the caller drops its records."""
        store = self.store
        assert store is not None
        waiting = self.client.in_backoff() or past_deadline
        if store.pending() or waiting:
            # Older batches are still to go: keep the order by queueing behind them.
            if self._keep(batch, store):
                return True
            if waiting:
                return False
        return self._post(batch, store, spooled=False) or self._keep(batch, store)

    def _keep(self, batch: SpooledBatch, store: BatchStore) -> bool:
        if store.append(batch.source, batch.seq, batch.records, batch.body):
            self.stats.spooled_batches += 1
            return True
        return False

    def replay_one(self) -> bool:
        """Send the oldest stored batch; ``False`` when there is none or the collector is away."""
        store = self.store
        assert store is not None
        batch = store.peek()
        if batch is None:
            return False
        return self._post(batch, store, spooled=True)

    def _post(self, batch: SpooledBatch, store: BatchStore, *, spooled: bool) -> bool:
        """Post ``batch`` and act on the answer: ``True`` when it is done with (acknowledged,
        refused or quarantined), ``False`` when it must wait for another try (backing off)."""
        outcome = self.client.post_batch(batch.body)
        if outcome.kind == RETRY:
            reason = self.poison.failed(batch, outcome)
            if reason is None:
                self.client.back_off(outcome)
                return False
            self._quarantine(batch, outcome, reason, store, spooled=spooled)
            return True
        if spooled:
            self.stats.replayed_batches += 1
        self._finish(batch, outcome, store, spooled=spooled)
        return True

    def _finish(self, batch: SpooledBatch, outcome: Outcome, store: BatchStore, spooled: bool) -> None:
        self.poison.forget()
        if outcome.kind == ACK:
            self.stats.sent_batches += 1
            self.stats.sent_records += batch.records
            if outcome.detail == "duplicate":
                self.stats.duplicate_batches += 1
        else:
            self.stats.rejected_batches += 1
            self._log_once(
                f"status {outcome.status}",
                "jobsight: the collector refused a batch (HTTP %d: %s); it is kept in %s/rejected",
                outcome.status,
                outcome.detail,
                self.settings.resolved_spool_dir(),
            )
            if spooled:
                store.reject(batch, outcome.status, outcome.detail)
            else:
                store.set_aside(batch, outcome.status, outcome.detail)
        if spooled:
            if outcome.kind == ACK:
                store.ack()
            if batch.source != self.source:
                return  # adopted from another process: not ours to count
        self._settle(batch.records)

    def _quarantine(
        self, batch: SpooledBatch, outcome: Outcome, reason: str, store: BatchStore, spooled: bool
    ) -> None:
        # Rare by construction (at most one batch per poison_after_s), so every one is logged.
        log.warning(
            "jobsight: batch %s/%d of %d records %s; it is kept in %s/rejected and the batches after it go on",
            batch.source,
            batch.seq,
            batch.records,
            reason,
            self.settings.resolved_spool_dir(),
        )
        self.stats.quarantined_batches += 1
        if spooled:
            store.reject(batch, outcome.status, outcome.detail, quarantined=reason)
        else:
            store.set_aside(batch, outcome.status, outcome.detail, quarantined=reason)
        # The backoff is left as it is: the next batch is posted at once (this try was
        # allowed), and a collector that fails it too is still backed off from.
        self._report_drops(records_of(batch), reason)
        if batch.source == self.source:
            self._settle(batch.records)

    def _log_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(message, *args)

    def close(self) -> None:
        """Close the connection and the store; unsent batches stay on disk for the next process."""
        self.client.close()
        store = self.store
        if store is not None:
            try:
                store.close()
            except Exception:  # noqa: BLE001 - boundary: closing is best-effort
                pass

    def abandon(self) -> None:
        """In a forked child: let go of the parent's store and socket without touching them."""
        store = self.store
        if store is not None:
            try:
                store.abandon()
            except Exception:  # noqa: BLE001 - boundary: the child must come up whatever the parent's state
                pass
        self.client.abandon()
