"""``jobsight compact``: pack closed hours of GPU and host samples into the packed tier now.

The same pass the collector runs on its timer (:func:`jobsight.collector.tiers.compaction.run_pass`),
against ``JOBSIGHT_DATABASE_URL``: ``--older-than 0s`` packs every hour before the current one
(UTC), ``--older-than 3d`` the hours that ended three days ago or earlier; without it, the hours
that ended ``JOBSIGHT_HOT_MINUTES`` ago. If a collector is running a pass, this one waits for it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import re
import time

from jobsight.commands.cli_error import CliError

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d|w)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
WAIT_POLL_S = 5.0


def parse_duration(text: str) -> dt.timedelta:
    """``90s``, ``15m``, ``2h``, ``3d``, ``1w`` (one unit, no sign) as a timedelta."""
    found = _DURATION.match(text.strip())
    if found is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 0s, 90m, 2h, 3d or 1w")
    return dt.timedelta(seconds=float(found.group(1)) * _UNIT_S[found.group(2)])


def configure_parser(name: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--older-than", type=parse_duration, metavar="DURATION",
        help="pack the hours that ended at least DURATION ago (0s: every hour before the current one; "
             "default: JOBSIGHT_HOT_MINUTES minutes)",
    )


def run(name: str, args: argparse.Namespace) -> int:
    import psycopg
    from psycopg.rows import dict_row

    from jobsight.collector.store import migrate
    from jobsight.collector.store.partitions import PartitionKeeper
    from jobsight.collector.tiers import compaction
    from jobsight.commands.server import load_settings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = load_settings()  # every section at once: a bad value is named before anything runs
    tiers = settings.tiers
    if not settings.database_url:
        raise CliError("JOBSIGHT_DATABASE_URL is not set")
    older_than = args.older_than if args.older_than is not None else tiers.older_than()
    try:
        if not migrate.schema_is_current(settings.database_url):
            raise CliError("the database schema is not current: run `jobsight migrate` first", code=1)
        with psycopg.connect(migrate.libpq_url(settings.database_url), autocommit=True, row_factory=dict_row) as conn:
            while True:
                report = compaction.run_pass(
                    conn, PartitionKeeper(), older_than=older_than,
                    packed_retention_days=tiers.packed_retention(settings.retention_days),
                )
                if report.ran:
                    break
                print(f"another compaction pass is running; trying again in {WAIT_POLL_S:.0f} s")
                time.sleep(WAIT_POLL_S)
    except psycopg.Error as exc:
        raise CliError(f"compaction failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                       code=1) from exc
    for day in report.days:
        freed = (f"{day.raw_bytes / 2**20:,.1f} MiB of raw rows freed" if day.whole
                 else f"{day.raw_rows:,} raw rows deleted")
        span = "" if day.whole else f" until {day.until:%H:%M} UTC"
        print(f"{day.day}{span}: {day.jobs} jobs, {day.samples:,} samples in {day.sample_blocks:,} blocks, "
              f"{day.minutes:,} minutes, {day.host_samples:,} host samples packed; {freed}")
    if not report.days:
        cutoff = compaction.hour_floor(dt.datetime.now(dt.UTC) - older_than)
        print(f"nothing to pack: no hour that ended by {cutoff:%Y-%m-%d %H:%M} UTC holds raw GPU or host rows")
    for name in report.dropped:
        print(f"dropped {name}")
    return 0
