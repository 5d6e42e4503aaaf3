"""Shared by the framework tests: agent settings aimed at a live collector, polling, reads."""

from __future__ import annotations

import gzip
import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from jobsight.agent.settings import AgentSettings

T = TypeVar("T")


def agent_settings(live: Any, job_id: str, tmp_path: Path) -> AgentSettings:
    return AgentSettings(
        url=live.url, token=live.token, job_id=job_id, node="testnode", spool_dir=str(tmp_path / "spool"),
        data_dir=str(tmp_path / "data"), batch_age_s=0.1, directive_poll_s=0.3,
    )


def wait_for(probe: Callable[[], T], timeout: float = 20.0, interval: float = 0.2) -> T:
    """``probe()`` once it is truthy; fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s (last value {value!r})")
        time.sleep(interval)


def api(live: Any, path: str, method: str = "GET", body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        live.url + path, data=data, method=method,
        headers={"Authorization": f"Bearer {live.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        raw = response.read()
        if response.headers.get("Content-Type", "").startswith("application/gzip"):
            return gzip.decompress(raw), response.headers
        return json.loads(raw)


def rows(db: Any, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    return list(db.execute(sql, params).fetchall())
