"""The job page's time window: the last 15 minutes, hour or 6 hours of the run, or all of it.

A running job's page opens on its recent window, read at the sampling's own resolution (a cell a
sample, :func:`jobsight.collector.query.grids.sampling_points`); an ended job's on all of it, read from
the rollups once its samples are many. The choice is kept in the address (``window=15m``), as the
page's other choices are (:mod:`jobsight.dashboard.url_state`).
"""

from __future__ import annotations

import datetime as dt
from typing import Final

from jobsight.dashboard import url_state

Domain = tuple[dt.datetime, dt.datetime]

PARAM: Final = "window"
"""The query parameter."""
KEY: Final = "job_window"
"""The widget's key."""
ALL: Final = "all"
RECENT: Final = "last 15 min"
SPANS: Final[dict[str, dt.timedelta | None]] = {
    RECENT: dt.timedelta(minutes=15),
    "last 1 h": dt.timedelta(hours=1),
    "last 6 h": dt.timedelta(hours=6),
    ALL: None,
}
"""Each choice and the span it shows, ``None`` for the whole run."""
TOKENS: Final = {"15m": RECENT, "1h": "last 1 h", "6h": "last 6 h", "all": ALL}
"""The address's token of each choice."""


def default(running: bool) -> str:
    """The recent window while the job runs, all of it once it ended."""
    return RECENT if running else ALL


def param(running: bool) -> url_state.Param:
    """The window as a query parameter bound to its widget, defaulting by the job's state."""
    return url_state.Param(PARAM, KEY, default(running), url_state.token_choice(TOKENS), url_state.token_text(TOKENS))


def span(choice: str | None) -> dt.timedelta | None:
    """The span of ``choice``; ``None`` (the whole run) for ``all`` or a choice it does not know."""
    return SPANS.get(choice or ALL)


def clip(domain: Domain, window: dt.timedelta | None) -> Domain:
    """The last ``window`` of ``domain`` (all of it when shorter, or ``window`` is ``None``)."""
    start, end = domain
    if window is None or end - start <= window:
        return domain
    return end - window, end
