"""The steady-state model of bench/storage.py: a site's whole database per GPU sample, from the
per-sample sizes of each tier that one bench run measured.

At steady state a site's database holds, per GPU, a window of raw rows (``raw_window_s``: at
most the open UTC hour, the hot minutes a closed hour waits, and one pass interval until a pass
comes round) and packed blocks for the rest of the retention; the rollups of both, the host
samples of both tiers, and the ``gpu_devices`` dictionary, which holds each GPU once whatever
the retention. Bytes per sample are the tiers' sizes weighted by the time each covers::

    B/sample = (raw_B * raw_window_s + packed_B * (retention_s - raw_window_s)) / retention_s
               + dictionary_B_per_GPU / retention_s

WAL is reported apart: it is recycled after each checkpoint, so it is not disk the database
keeps, but every byte of it is written (and shipped to replicas and archives): as measured with
no checkpoint in the run, and with the full-page images a site's checkpoints add.
"""

from __future__ import annotations

from dataclasses import dataclass

SITE_NODES, SITE_GPUS_PER_NODE = 500, 8
"""The site the bench prices: 500 nodes of 8 GPUs sampled at 1 Hz."""
SITE_SAMPLES_PER_DAY = SITE_NODES * SITE_GPUS_PER_NODE * 86400

PACKED_TARGET = 8.0
"""B/GPU sample, packed tier all in (blocks, timelines, dictionary, packed rollup)."""
WHOLE_TARGET = 16.0
"""B/GPU sample, whole database at steady state with 90 days' retention."""


@dataclass(frozen=True)
class Settings:
    """A site's settings that decide how much stays raw and how long anything stays."""

    retention_days: int = 90
    hot_minutes: int = 15
    """``JOBSIGHT_HOT_MINUTES``: an hour is packed once it has been closed this long."""
    compact_interval_s: int = 300
    """``JOBSIGHT_COMPACT_INTERVAL_S``: how often each collector tries a pass."""

    @property
    def retention_s(self) -> int:
        return self.retention_days * 86400

    @property
    def raw_window_s(self) -> int:
        # The worst case: the newest sample of an hour waits for the hour to end, then the hot
        # minutes, then up to one interval for the next pass. Averaging would be lower; the
        # upper bound keeps the figure honest for sizing disks. Capped by the retention.
        return min(3600 + self.hot_minutes * 60 + self.compact_interval_s, self.retention_s)


@dataclass(frozen=True)
class Measured:
    """One bench run's sizes, in bytes per GPU sample, all in (heap, TOAST, indexes, maps)."""

    raw_samples: float
    """``gpu_samples`` while the rows are raw."""
    raw_rollup: float
    """``gpu_minutes`` and ``gpu_hours`` while the minutes are raw."""
    packed_samples: float
    """``gpu_sample_blocks``, ``gpu_sample_timelines`` (and the emptied raw partitions)."""
    packed_rollup: float
    """``gpu_minute_blocks`` and ``gpu_hours`` (never packed), with the emptied ``gpu_minutes``."""
    raw_host: float
    """``host_samples``, per GPU sample (one host sample stands for a node's GPUs at a tick)."""
    packed_host: float
    """``host_sample_blocks`` with the emptied ``host_samples``, per GPU sample."""
    dictionary_per_gpu: float
    """``gpu_devices`` in bytes per GPU (not per sample): a GPU is held once."""
    wal: float
    """WAL written per GPU sample, every phase of its life (host samples' folded in), with no
    checkpoint in between."""
    wal_images: float
    """The full-page images a site's checkpoints would add per GPU sample."""
    packed_tier: float
    """The packed tier as the bench's table reports it: GPU tables only, the dictionary spread
    over this run's samples."""


@dataclass(frozen=True)
class SteadyState:
    """Each term's share of the whole database, in bytes per GPU sample."""

    raw: float
    packed: float
    rollups: float
    host: float
    dictionary: float

    @property
    def total(self) -> float:
        return self.raw + self.packed + self.rollups + self.host + self.dictionary


def steady_state(measured: Measured, settings: Settings) -> SteadyState:
    raw_share = settings.raw_window_s / settings.retention_s
    packed_share = 1.0 - raw_share
    return SteadyState(
        raw=measured.raw_samples * raw_share,
        packed=measured.packed_samples * packed_share,
        rollups=measured.raw_rollup * raw_share + measured.packed_rollup * packed_share,
        host=measured.raw_host * raw_share + measured.packed_host * packed_share,
        dictionary=measured.dictionary_per_gpu / settings.retention_s,
    )


def duration(seconds: int) -> str:
    """``1 h 20 min``, ``45 min``, ``2 h``."""
    hours, minutes = divmod(seconds // 60, 60)
    parts = [f"{hours} h"] * bool(hours) + [f"{minutes} min"] * bool(minutes)
    return " ".join(parts) or f"{seconds} s"


def retention(days: int) -> str:
    return f"{days} day's" if days == 1 else f"{days} days'"


def target(what: str, value: float, limit: float) -> str:
    return f"target: {what} <= {limit:g} B/GPU sample ({value:.2f}): {'met' if value <= limit else 'not met'}"


def report(measured: Measured, settings: Settings) -> list[str]:
    """The steady-state lines: the whole database, the site, and the two targets."""
    state = steady_state(measured, settings)
    site_samples = SITE_SAMPLES_PER_DAY * settings.retention_days
    return [
        f"steady state, {retention(settings.retention_days)} retention, raw window {duration(settings.raw_window_s)}: "
        f"{state.total:.2f} B/GPU sample all in (raw {state.raw:.2f}, packed {state.packed:.2f}, "
        f"rollups {state.rollups:.2f}, host {state.host:.2f}, dictionary {state.dictionary:.2g}), "
        f"WAL written {measured.wal:.0f} B/sample ({measured.wal + measured.wal_images:.0f} with a site's checkpoints)",
        f"site, {SITE_NODES} nodes x {SITE_GPUS_PER_NODE} GPUs at 1 Hz: {state.total * site_samples / 1e9:,.0f} GB "
        f"on disk at steady state ({site_samples / 1e9:,.1f} G samples kept), "
        f"WAL written {measured.wal * SITE_SAMPLES_PER_DAY / 1e9:,.0f} GB a day "
        f"({(measured.wal + measured.wal_images) * SITE_SAMPLES_PER_DAY / 1e9:,.0f} with its checkpoints)",
        target("packed tier", measured.packed_tier, PACKED_TARGET),
        target(f"whole database at {retention(settings.retention_days)} retention", state.total, WHOLE_TARGET),
    ]
