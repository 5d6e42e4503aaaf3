"""The read API's parameter types, declared once: what a query or path value may be before
it reaches SQL, so a value PostgreSQL cannot take is a 422 naming the parameter, not a 500.

* integers are bounded by the column they are compared with (``int4``, ``int8``);
* times are ISO 8601 strings (pydantic alone would read ``0.5`` as Unix time), naive ones
  are UTC like everything on the wire, and each is normalised to UTC;
* no string, query or path, may hold a NUL character (PostgreSQL text cannot):
  :func:`refuse_nul` checks every one, for every route, as an app-wide dependency.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any

from fastapi import Path, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import AfterValidator, BeforeValidator, Field

INT4_MAX = 2**31 - 1
INT8_MAX = 2**63 - 1

Int4 = Annotated[int, Field(ge=-(2**31), le=INT4_MAX)]
"""An integer an ``int4`` column can be compared with."""
Int8 = Annotated[int, Field(ge=-(2**63), le=INT8_MAX)]
"""An integer an ``int8`` column can be compared with."""
Count8 = Annotated[int, Field(ge=0, le=INT8_MAX)]
"""A non-negative ``int8`` (offsets)."""
Id8 = Annotated[int, Field(ge=1, le=INT8_MAX)]
"""A row id of an identity ``int8`` column (they start at 1)."""

RankQuery = Annotated[Int4 | None, Query(description="training rank")]
PidQuery = Annotated[Int4 | None, Query(description="process id")]
TidQuery = Annotated[Int8 | None, Query(description="thread id")]
OffsetQuery = Annotated[Count8, Query(description="rows to skip")]
ProfileRowId = Annotated[Id8, Path(description="the profile's row id (``id`` in the profile list)")]
RequestId = Annotated[Id8, Path(description="the profile request's id")]

_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _iso_8601_only(value: Any) -> Any:
    # pydantic reads a number (or a string of one) as Unix time: "until=0.5" would mean
    # 1970. Times are ISO 8601 here, so anything not starting like a date is refused.
    if isinstance(value, dt.datetime):
        return value
    if not isinstance(value, str) or not _ISO_DATE.match(value.strip()):
        raise ValueError("expected an ISO 8601 date or time, e.g. 2025-01-31T12:00:00Z")
    return value.strip()


def _as_utc(value: dt.datetime) -> dt.datetime:
    # Naive times are UTC, as on the wire; aware ones are turned into UTC here, so an
    # offset that leaves the calendar (year 1 at +01:00) is refused instead of failing later.
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    try:
        return value.astimezone(dt.UTC)
    except OverflowError as exc:
        raise ValueError("time out of range") from exc


IsoTime = Annotated[dt.datetime, BeforeValidator(_iso_8601_only), AfterValidator(_as_utc)]
"""An ISO 8601 date or date-time, in UTC (naive means UTC)."""


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("NUL character is not allowed")
    return value


CleanStr = Annotated[str, AfterValidator(_no_nul)]
"""A string without NUL, for request bodies (query and path values are checked by :func:`refuse_nul`)."""


async def refuse_nul(request: Request) -> None:
    """422 naming the first query or path parameter that holds a NUL character.

    ``async`` though it awaits nothing: FastAPI runs a plain ``def`` dependency in its thread
    pool, and this one runs for every request (a round trip between threads for each batch)."""
    problems = [
        {"type": "string_nul", "loc": (where, name), "msg": "NUL character is not allowed", "input": value}
        for where, items in (("path", request.path_params.items()), ("query", request.query_params.multi_items()))
        for name, value in items
        if isinstance(value, str) and "\x00" in value
    ]
    if problems:
        raise RequestValidationError(problems)
