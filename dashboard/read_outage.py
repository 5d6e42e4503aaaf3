"""What a page says when the database cannot be read, and the one log line per outage that names why.

A read fails for the database's sake when no connection opens (a refused password, the server down or
unknown), when every pooled connection stays busy past the wait, or when PostgreSQL cancels it at the
read connections' ``statement_timeout``. The page then says so in words (never a traceback, never the
driver's text: only a cause in words, :meth:`Unreadable.words`), runs again on a timer until it reads,
and stops (:func:`stop_page`). The dashboard's log gets the driver's own text, the password taken out, once
when an outage begins and once when it ends (:class:`ReadOutage`), however many pages meet it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final, Literal, NoReturn

import psycopg
import streamlit as st
from psycopg.conninfo import conninfo_to_dict
from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

from jobsight.collector.store.migrate import libpq_url

log = logging.getLogger("jobsight.dashboard.reads")

PROBE_TIMEOUT_S: Final = 5
"""How long the probe of :func:`connection_cause` waits for the server (libpq's ``connect_timeout``)."""

Kind = Literal["login", "unreachable", "unconfigured", "busy", "slow", "other"]

_WORDS: Final[dict[Kind, str]] = {
    "login": "the database refused the dashboard's login (its user name or password)",
    "unreachable": "the database server cannot be reached",
    "unconfigured": "the dashboard was started without a database (JOBSIGHT_DATABASE_URL is not set)",
    "busy": "every database connection of the dashboard stayed busy with other pages' reads",
    "slow": "the database took too long to answer and the read was cancelled",
    "other": "the database refused the dashboard's connection",
}
# What libpq and PostgreSQL say, lower case, by the cause in words it belongs to.
_MARKERS: Final[tuple[tuple[Kind, tuple[str, ...]], ...]] = (
    ("login", ("password authentication failed", "no password supplied", "authentication failed",
               "role \"", "pg_hba.conf")),
    ("unreachable", ("connection refused", "could not connect", "timeout expired", "could not translate host name",
                     "no such file or directory", "server closed the connection", "name or service not known",
                     "the database system is starting up", "the database system is shutting down",
                     "terminating connection")),
)


class Unreadable(Exception):  # noqa: N818 (it names a state of the database, as DatabaseUnavailable does)
    """The database cannot be read now: ``kind`` says why in a word, ``detail`` is the driver's text
    (password removed) for the log; ``None`` when there is none to give (the URL is not set)."""

    def __init__(self, kind: Kind, detail: str | None = None) -> None:
        super().__init__(kind, detail)
        self.kind: Kind = kind
        self.detail = detail

    def words(self, retry_s: float) -> str:
        """What the page says: no exception text, the cause in words, and that it tries again."""
        return (f"The database cannot be read just now, so this page cannot show its data. Cause: {_WORDS[self.kind]}. "
                f"The page tries again every {retry_s:.0f} s; the dashboard's log names the cause in full.")


def redacted(text: str, database_url: str) -> str:
    """``text`` on one line, without the password of ``database_url`` (a driver's message quotes its
    parameters at times) and at most 500 characters."""
    one_line = " ".join(line.strip() for line in text.splitlines() if line.strip())
    try:
        password = conninfo_to_dict(libpq_url(database_url)).get("password")
    except psycopg.ProgrammingError:  # not a URL libpq reads: nothing in it can be found in the text
        password = None
    if password:
        one_line = one_line.replace(str(password), "***")
    return one_line[:500]


def classify(detail: str) -> Kind:
    """The cause in words that a driver's message belongs to."""
    lowered = detail.lower()
    for kind, markers in _MARKERS:
        if any(marker in lowered for marker in markers):
            return kind
    return "other"


def connection_cause(database_url: str) -> Unreadable | None:
    """Why a new connection to ``database_url`` does not open, as :class:`Unreadable`; ``None`` when one
    opens (the server is there and takes the login). Used when the pool gave no connection in time: the
    pool's wait says only that it had none, not whether the server refused it."""
    try:
        with psycopg.connect(libpq_url(database_url), connect_timeout=PROBE_TIMEOUT_S,
                             application_name="jobsight-dashboard-probe"):
            return None
    except psycopg.Error as exc:
        detail = redacted(str(exc) or type(exc).__name__, database_url)
        return Unreadable(classify(detail), detail)


class ReadOutage:
    """This process's view of one database: one log line when the pages stop reading it (naming the
    cause), one when they read again, whatever the number of pages and reruns in between."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: float | None = None
        self._met = 0

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def met(self, problem: Unreadable, retry_s: float) -> Unreadable:
        """Note a read that met ``problem`` (logged only when the outage begins); returns ``problem``."""
        with self._lock:
            self._met += 1
            if self._since is not None:
                return problem
            self._since = time.monotonic()
        log.warning("the dashboard cannot read the database; its pages say so and retry every %.0f s: %s (%s)",
                    retry_s, _WORDS[problem.kind], problem.detail or "no detail")
        return problem

    def passed(self) -> None:
        if self._since is None:  # the usual case: no lock taken
            return
        with self._lock:
            since, met, self._since, self._met = self._since, self._met, None, 0
        if since is not None:
            log.warning("the dashboard reads the database again after %.0f s (%d read(s) met the outage)",
                        time.monotonic() - since, met)


_OUTAGES: dict[str, ReadOutage] = {}
_OUTAGES_LOCK = threading.Lock()


def outage_of(database_url: str) -> ReadOutage:
    """The :class:`ReadOutage` of ``database_url`` (one a database: tests run pages of several)."""
    with _OUTAGES_LOCK:
        return _OUTAGES.setdefault(database_url, ReadOutage())


def stop_page(problem: Unreadable, retry_s: float) -> NoReturn:
    """Say ``problem`` in words where the page has got to, set the page to run again in ``retry_s``
    (:func:`retry_later`) and stop it (``st.stop``); outside a Streamlit run (a bench calling the
    readers) raise it instead.

    Both are drawn here, inside the cached reader that met the problem (Streamlit keeps nothing of a
    call that raised): nothing can be drawn after ``st.stop``, and an exception left to the page would
    reach Streamlit's handler, which shows its traceback."""
    if get_script_run_ctx(suppress_warning=True) is None:
        raise problem
    st.warning(problem.words(retry_s), icon=":material/cloud_off:")
    retry_later(retry_s)
    st.stop()


def retry_later(every_s: float) -> None:
    """Run the whole page again in ``every_s`` (and again, while it cannot read): a fragment on a timer
    whose first run (now, as it is declared) does nothing. Nothing sleeps meanwhile, so the reader may
    still click; a fragment that meets the problem gets one too, nested in it."""
    runs = iter(range(1_000_000_000))

    def tick() -> None:
        if next(runs):
            st.rerun()

    fragment: Callable[[], None] = st.fragment(tick, run_every=every_s)
    fragment()
