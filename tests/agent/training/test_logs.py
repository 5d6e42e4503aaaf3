"""The logging handler, end to end: a log call in the test lands as a row in ``log_events``."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.shipper import Shipper
from jobsight.agent.training.logs import JobsightHandler, attach


@pytest.fixture
def shipped(
    live_collector: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, Shipper, logging.Logger]]:
    monkeypatch.setenv("RANK", "3")
    job = f"test-{uuid4().hex}"
    settings = AgentSettings(
        url=live_collector.url,
        token=live_collector.token,
        spool_dir=str(tmp_path / "spool"),
        job_id=job,
        node="lognode",
        batch_age_s=0.05,
    )
    shipper = Shipper(settings)
    handler = JobsightHandler(logging.DEBUG, settings, shipper)
    logger = logging.getLogger(f"train.{uuid4().hex}")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield job, shipper, logger
    finally:
        logger.removeHandler(handler)
        shipper.shutdown(1.0)


def _rows(collector: Any, job: str) -> list[dict[str, Any]]:
    with psycopg.connect(collector.database_url) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute("SELECT * FROM log_events WHERE job_id = %s ORDER BY ts", (job,))
        return list(cur.fetchall())


class _Opaque:
    def __repr__(self) -> str:
        return "<opaque thing>"


def test_log_lines_arrive_with_their_fields(live_collector: Any, shipped: tuple[str, Shipper, logging.Logger]) -> None:
    job, shipper, logger = shipped
    tids: dict[str, int] = {}

    def work() -> None:
        tids["worker"] = threading.get_native_id()
        logger.warning(
            "step %d slow",
            7,
            extra={"step": 7, "loss": float("nan"), "big": float("inf"), "obj": _Opaque(), "nested": {"a": [1, 2.5]}},
        )
        try:
            1 / 0  # noqa: B018 - the exception is the point
        except ZeroDivisionError:
            logger.exception("division failed")

    thread = threading.Thread(target=work, name="data-worker")
    thread.start()
    thread.join()
    assert shipper.flush(10.0)

    first, second = _rows(live_collector, job)
    assert first["level"] == "WARNING"
    assert first["message"] == "step 7 slow"
    assert first["logger"] == logger.name
    assert first["node"] == "lognode"
    assert first["rank"] == 3
    assert first["pid"] == os.getpid()
    assert first["tid"] == tids["worker"]
    assert first["thread"] == "data-worker"
    assert first["exception"] is None
    assert first["attrs"] == {
        "step": 7,
        "loss": "nan",
        "big": "inf",
        "obj": "<opaque thing>",
        "nested": {"a": [1, 2.5]},
    }

    assert second["level"] == "ERROR"
    assert second["message"] == "division failed"
    assert "Traceback" in second["exception"]
    assert "ZeroDivisionError" in second["exception"]
    assert second["attrs"] is None


def test_own_loggers_are_not_shipped(live_collector: Any, shipped: tuple[str, Shipper, logging.Logger]) -> None:
    job, shipper, logger = shipped
    handler = logger.handlers[0]
    own = logging.getLogger("jobsight.agent.test")
    own.addHandler(handler)
    try:
        own.warning("about the shipper itself")
        logger.info("from the user")
    finally:
        own.removeHandler(handler)
    assert shipper.flush(10.0)
    assert [row["message"] for row in _rows(live_collector, job)] == ["from the user"]


def test_attach_is_idempotent(tmp_path: Path) -> None:
    root = logging.getLogger()
    level = root.level
    settings = AgentSettings(spool_dir=str(tmp_path / "spool"), job_id="attach-test")
    try:
        first = attach(logging.INFO, settings)
        assert attach(logging.INFO, settings) is first
        assert sum(isinstance(h, JobsightHandler) for h in root.handlers) == 1
        assert root.level <= logging.INFO
    finally:
        for handler in [h for h in root.handlers if isinstance(h, JobsightHandler)]:
            root.removeHandler(handler)
        root.setLevel(level)
