"""The carbon intensity of each hour a job ran, so its energy can be said in kg CO2e.

kg CO2e = kWh x PUE x intensity (g/kWh) / 1000 (:func:`emissions_kg`). An hour's intensity is a
time series' value at or before it (within :data:`SERIES_REACH`) where the site configured one,
else the yearly fallback: the site's own value, or its country's or region's mean from
codecarbon's dataset (:mod:`jobsight.collector.config.carbon`). Every figure says where it comes
from (:attr:`Intensity.source`), a fallback why it was needed, so a page can show it.

The series is read lazily and kept: an endpoint's answer (a failure too) for ``series_cache_s``,
so a page listing many jobs, or an endpoint that is down, costs one request per period; a CSV
file until its modification time or size changes. Both are read up to :data:`MAX_SERIES_BYTES`.
An endpoint's token is read from its file at each request (a rotated one is picked up), sent as
``auth-token`` and never logged; the endpoint is named by its host only (its path or query may
carry a key), and redirects are refused (urllib would send the token on to the new host). Only HTTPS,
the certificate verified against ``series_ca_file`` or the system's CAs: the token never travels in clear.
"""

from __future__ import annotations

import csv
import http.client
import io
import json
import logging
import math
import os
import ssl
import threading
import time
import urllib.error
import urllib.request
from bisect import bisect_right
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from jobsight.collector.config.carbon import CarbonSettings, read_token, yearly_figure

log = logging.getLogger("jobsight.collector.query.carbon_intensity")

SERIES_REACH = timedelta(hours=3)
"""A series' value stands for the hours after it up to this far: an hour further from the last
value before it falls back to the yearly figure."""
MAX_SERIES_BYTES = 32 * 1024 * 1024
"""A series (file or answer) larger than this is refused: a year of hourly rows is about 1 MB."""
HTTP_TIMEOUT_S = 5.0
"""A request to the endpoint waits this long at most (a page waits on it once per cache period)."""

_CSV_TIMES = ("datetime", "datetime (utc)")
_CSV_VALUES = ("carbonintensity", "carbon_intensity")


@dataclass(frozen=True)
class Intensity:
    """An hour's carbon intensity and where it comes from, in words a page shows as they are."""

    g_per_kwh: float
    source: str


def emissions_kg(kwh: float, intensity_g_per_kwh: float, pue: float) -> float:
    """kg CO2e of ``kwh`` used by the GPUs: the site drew ``pue`` times as much, at
    ``intensity_g_per_kwh`` grams per kWh drawn."""
    return kwh * pue * intensity_g_per_kwh / 1000.0


@dataclass(frozen=True)
class _Series:
    times: list[datetime]
    values: list[float]

    def at(self, hour: datetime) -> float | None:
        """The last value at or before ``hour`` within :data:`SERIES_REACH`; ``None``: none."""
        index = bisect_right(self.times, hour) - 1
        if index < 0 or hour - self.times[index] > SERIES_REACH:
            return None
        return self.values[index]


class SeriesError(Exception):
    """A series that cannot be read; the message says why in words a page may show (no token, no URL)."""


def _time(text: str) -> datetime:
    """An ISO 8601 time, in UTC; one without a zone is UTC (the data portal's ``Datetime (UTC)``)."""
    moment = datetime.fromisoformat(text.strip())
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _value(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise ValueError("not a number")
    value = float(raw)
    if not math.isfinite(value) or value < 0:
        raise ValueError("not a finite, non-negative number")
    return value


def _series(points: list[tuple[datetime, float]]) -> _Series:
    points.sort(key=lambda point: point[0])
    return _Series([t for t, _ in points], [v for _, v in points])


def parse_history(body: bytes) -> _Series:
    """Electricity Maps' ``carbon-intensity/history`` answer: ``{"history": [{"datetime": …,
    "carbonIntensity": …}, …]}``; an entry whose intensity is ``null`` (a gap) is skipped."""
    try:
        data = json.loads(body)
    except ValueError:
        raise SeriesError("the answer is not JSON") from None
    history = data.get("history") if isinstance(data, dict) else None
    if not isinstance(history, list):
        raise SeriesError("the answer has no history list")
    points: list[tuple[datetime, float]] = []
    for number, entry in enumerate(history):
        if not isinstance(entry, dict) or not isinstance(entry.get("datetime"), str):
            raise SeriesError(f"history entry {number} has no datetime")
        if entry.get("carbonIntensity") is None:
            continue
        try:
            points.append((_time(entry["datetime"]), _value(entry["carbonIntensity"])))
        except ValueError as exc:
            raise SeriesError(f"history entry {number}: {exc}") from None
    return _series(points)


def _column(header: list[str], wanted: tuple[str, ...], life_cycle: bool) -> int | None:
    names = [name.strip().lower() for name in header]
    for name in wanted:
        if name in names:
            return names.index(name)
    if life_cycle:  # the data portal: "Carbon Intensity gCO₂eq/kWh (life cycle assessment)" or "(Life cycle)"
        for index, name in enumerate(names):
            if name.startswith("carbon intensity") and "life cycle" in name:
                return index
    return None


def parse_csv(text: str) -> _Series:
    """A CSV of ``datetime,carbonIntensity`` (or ``carbon_intensity``, or the data portal's columns);
    a row with an empty intensity (a gap) is skipped."""
    rows = csv.reader(io.StringIO(text))
    header = next(rows, None)
    if header is None:
        raise SeriesError("the file is empty")
    at, value = _column(header, _CSV_TIMES, False), _column(header, _CSV_VALUES, True)
    if at is None or value is None:
        raise SeriesError("the file has no datetime and carbonIntensity columns")
    points: list[tuple[datetime, float]] = []
    for row in rows:
        if not row or (len(row) > value and not row[value].strip()):
            continue
        if len(row) <= max(at, value):
            raise SeriesError(f"line {rows.line_num}: too few columns")
        try:
            points.append((_time(row[at]), _value(row[value])))
        except ValueError as exc:
            raise SeriesError(f"line {rows.line_num}: {exc}") from None
    return _series(points)


def _why(reason: object) -> str:
    """Words for a failed request that cannot quote its URL: an OS error's text, or the kind."""
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    if isinstance(reason, TimeoutError):
        return "timed out"
    return reason if isinstance(reason, str) else type(reason).__name__


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuses redirects: urllib would send the ``auth-token`` header on to the new host."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _opener(ca_file: str | None) -> urllib.request.OpenerDirector:
    """An opener that verifies the endpoint's certificate (against ``ca_file``, else the system's CAs),
    follows no redirect and speaks nothing but HTTPS (the settings take no other URL)."""
    context = ssl.create_default_context(cafile=ca_file)
    return urllib.request.build_opener(_NoRedirect, urllib.request.HTTPSHandler(context=context))


class CarbonIntensity:
    """The intensity of hours, from the ``[carbon]`` settings; safe to share between threads."""

    def __init__(self, settings: CarbonSettings) -> None:
        self.settings = settings
        self._yearly = self._read_yearly()
        self._lock = threading.Lock()
        self._series: _Series | None = None
        self._error: str | None = None
        self._read_at = -math.inf  # time.monotonic() of the last request (the endpoint)
        self._file_key: tuple[int, int] | None = None  # (mtime_ns, size) of the file last read
        self._failing = False
        self._opener = _opener(settings.series_ca_file) if settings.series_url is not None else None

    def _read_yearly(self) -> Intensity | None:
        settings = self.settings
        if settings.intensity_g_per_kwh is not None:
            return Intensity(settings.intensity_g_per_kwh, "site value")
        if settings.country is None and settings.region is None:
            return None
        figure = yearly_figure(settings.country, settings.region)
        year = f" {figure.year}" if figure.year is not None else ""
        return Intensity(figure.g_per_kwh, f"{figure.place} yearly mean{year} ({figure.basis})")

    def yearly(self) -> Intensity | None:
        """The site's value, else the country's or region's yearly mean; ``None``: neither is set."""
        return self._yearly

    def series_name(self) -> str | None:
        """The series in words (an endpoint by its host only); ``None``: no series."""
        if self.settings.series_url is not None:
            return f"time series ({self.settings.series_host()})"
        if self.settings.series_csv is not None:
            return f"time series file {self.settings.series_csv}"
        return None

    def configured(self) -> bool:
        """Whether any intensity is configured: where not, callers show kWh without CO2e."""
        return self._yearly is not None or self.series_name() is not None

    def describe(self) -> dict[str, Any]:
        """What is configured, for the API and the pages (never the token, nor the URL past its host)."""
        yearly = self._yearly
        return {
            "configured": self.configured(),
            "pue": self.settings.pue,
            "yearly": None if yearly is None else {"g_per_kwh": yearly.g_per_kwh, "source": yearly.source},
            "series": self.series_name(),
            "series_cache_s": self.settings.series_cache_s if self.settings.series_url is not None else None,
        }

    def for_hours(self, hours: list[datetime]) -> list[Intensity]:
        """Each hour's intensity (``hours``: aware hour starts), in order; ``[]`` where nothing is
        configured (the settings make sure a series always has a yearly fallback)."""
        if not self.configured() or not hours:
            return []
        for hour in hours:
            if hour.tzinfo is None:
                raise ValueError("for_hours takes aware datetimes (UTC hour starts)")
        name = self.series_name()
        if name is None:
            assert self._yearly is not None
            return [self._yearly for _ in hours]
        series, error = self._current_series()
        fallback = self._yearly
        assert fallback is not None  # CarbonSettings refuses a series without one
        found: list[Intensity] = []
        for hour in hours:
            value = None if series is None else series.at(hour.astimezone(UTC))
            if value is not None:
                found.append(Intensity(value, name))
            elif error is not None:
                found.append(Intensity(fallback.g_per_kwh, f"{fallback.source} (the series failed: {error})"))
            else:
                reach = int(SERIES_REACH.total_seconds() // 3600)
                found.append(Intensity(fallback.g_per_kwh,
                                       f"{fallback.source} (the series has no value in the {reach} h up to this hour)"))
        return found

    def _current_series(self) -> tuple[_Series | None, str | None]:
        """The series and, if the last read failed, why; read again when due."""
        with self._lock:
            try:
                if self.settings.series_url is not None:
                    if time.monotonic() - self._read_at >= self.settings.series_cache_s:
                        self._read_at = time.monotonic()  # a failure is kept as long as an answer
                        self._series = self._fetch(self.settings.series_url)
                        self._recovered()
                elif self.settings.series_csv is not None:
                    self._read_file(self.settings.series_csv)
            except SeriesError as exc:
                self._series, self._error = None, str(exc)
                if not self._failing:
                    self._failing = True
                    log.warning("carbon intensity: %s failed: %s; using the yearly figure until it answers",
                                self.series_name(), exc)
            return self._series, self._error

    def _recovered(self) -> None:
        if self._failing:
            log.warning("carbon intensity: %s answers again", self.series_name())
        self._failing, self._error = False, None

    def _read_file(self, path: str) -> None:
        try:
            stat = os.stat(path)
        except OSError as exc:
            self._file_key = None
            raise SeriesError(f"cannot read the file: {exc.strerror or exc}") from None
        key = (stat.st_mtime_ns, stat.st_size)
        if key == self._file_key:
            return
        self._file_key = key  # a bad file is not parsed again until it changes
        if stat.st_size > MAX_SERIES_BYTES:
            raise SeriesError(f"the file is larger than {MAX_SERIES_BYTES // 2**20} MiB")
        try:
            with open(path, "rb") as handle:
                raw = handle.read(MAX_SERIES_BYTES + 1)
        except OSError as exc:
            raise SeriesError(f"cannot read the file: {exc.strerror or exc}") from None
        if len(raw) > MAX_SERIES_BYTES:
            raise SeriesError(f"the file is larger than {MAX_SERIES_BYTES // 2**20} MiB")
        self._series = parse_csv(raw.decode("utf-8-sig", "replace"))
        self._recovered()

    def _fetch(self, url: str) -> _Series:
        headers = {"Accept": "application/json"}
        if self.settings.series_token_file is not None:
            try:
                headers["auth-token"] = read_token(self.settings.series_token_file)
            except ValueError as exc:
                raise SeriesError(str(exc)) from None
        request = urllib.request.Request(url, headers=headers)
        if self._opener is None or request.type != "https":
            raise SeriesError("the endpoint must be https://")  # the settings refuse any other; kept here too
        try:
            with self._opener.open(request, timeout=HTTP_TIMEOUT_S) as answer:
                body = answer.read(MAX_SERIES_BYTES + 1)
        except urllib.error.HTTPError as exc:
            exc.close()
            moved = " (redirects are not followed)" if 300 <= exc.code < 400 else ""
            raise SeriesError(f"HTTP {exc.code}{moved}") from None
        except urllib.error.URLError as exc:
            raise SeriesError(_why(exc.reason)) from None
        except (OSError, http.client.HTTPException) as exc:  # a timeout while reading, a broken answer
            raise SeriesError(_why(exc)) from None
        if len(body) > MAX_SERIES_BYTES:
            raise SeriesError(f"the answer is larger than {MAX_SERIES_BYTES // 2**20} MiB")
        return parse_history(body)
