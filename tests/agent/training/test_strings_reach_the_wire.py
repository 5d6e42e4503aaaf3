"""Whatever text a training process logs or reports, the collector takes its batches.

A file name that is not UTF-8 reaches Python as a lone surrogate (``os.fsdecode``), which the
collector refuses (PostgreSQL cannot store it): one such log line used to have its whole batch
refused, and the clean lines with it. The handler and the run records now write every string
out as the wire takes it. No live collector is needed: a stand-in answers ``/v1/ingest`` by
running the real validator (``wire.decode_batch``) on each body, 200 or 422 as the collector would.
"""

from __future__ import annotations

import base64
import gzip
import json
import logging
import os
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from jobsight.agent.settings import AgentSettings
from jobsight.agent.shipping.shipper import Shipper
from jobsight.agent.traces.trace_packing import pack_trace
from jobsight.agent.training.context import process_owner
from jobsight.agent.training.logs import JobsightHandler
from jobsight.agent.training.run_records import RunRecorder
from jobsight.protocol import wire

NAME = os.fsdecode(b"data-\xff.bin")  # "data-\udcff.bin"
SHOWN = "data-\\xff.bin"


class _Collector(ThreadingHTTPServer):
    """Validates every batch it is sent; keeps what it took and what it refused."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Ingest)
        self.records: list[dict[str, Any]] = []
        self.refused: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Ingest(BaseHTTPRequestHandler):
    server: _Collector

    def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        try:
            batch = wire.decode_batch(body)
        except wire.WireError as exc:
            self.server.refused.append(exc.as_dict())
            self._answer(422, {"detail": exc.as_dict()})
            return
        self.server.records.extend(batch.records)
        self._answer(200, {"status": "stored", "source": batch.source, "seq": batch.seq,
                           "records": len(batch.records)})

    def _answer(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass


@pytest.fixture
def collector() -> Iterator[_Collector]:
    server = _Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def settings(collector: _Collector, tmp_path: Path) -> AgentSettings:
    return AgentSettings(url=collector.url, token="test-token", job_id=f"strings-{uuid.uuid4().hex[:8]}",
                         node="n1", spool_dir=str(tmp_path / "spool"), data_dir=str(tmp_path), batch_age_s=0.05)


def test_a_log_line_naming_a_file_that_is_not_utf8_is_stored_with_the_clean_ones(
    collector: _Collector, settings: AgentSettings
) -> None:
    shipper = Shipper(settings)
    handler = JobsightHandler(logging.DEBUG, settings, shipper)
    logger = logging.getLogger(f"train.{uuid.uuid4().hex}")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    odd_logger = logger.getChild(os.fsdecode(b"r\xe9sultats"))
    odd_logger.addHandler(handler)
    odd_logger.propagate = False
    try:
        logger.warning("cannot read %s", NAME, extra={"path": NAME, os.fsdecode(b"k\xfe"): 1})
        logger.info("clean line 1")
        try:
            raise OSError(f"no such file: {NAME}")
        except OSError:
            logger.exception("loading failed")
        worker = threading.Thread(target=lambda: logger.info("from the worker"), name=os.fsdecode(b"w\xff"))
        worker.start()
        worker.join()
        odd_logger.info("clean line 2")
        assert shipper.flush(10.0)
    finally:
        logger.removeHandler(handler)
        odd_logger.removeHandler(handler)
        shipper.shutdown(1.0)

    assert collector.refused == []
    lines = {r["message"]: r for r in collector.records}
    assert list(lines) == [f"cannot read {SHOWN}", "clean line 1", "loading failed", "from the worker", "clean line 2"]
    assert lines[f"cannot read {SHOWN}"]["attrs"] == {"path": SHOWN, "k\\xfe": 1}
    assert f"no such file: {SHOWN}" in lines["loading failed"]["exception"]
    assert lines["from the worker"]["thread"] == "w\\xff"
    assert lines["clean line 2"]["logger"].endswith(".r\\xe9sultats")


def test_run_records_with_odd_text_and_numbers_are_stored(collector: _Collector, settings: AgentSettings) -> None:
    recorder = RunRecorder(settings, rank=0)
    trace, note = pack_trace(b'{"traceEvents": []}', 1024 * 1024)
    try:
        recorder.run_started(name=NAME, attrs={NAME: NAME})
        recorder.event(f"checkpoint {NAME}", level="WARNING", exception=ValueError(NAME), file=NAME)
        recorder.metrics({f"loss/{NAME}": 0.5})
        # A clock that stepped back gives a negative wait; a huge count is no int4.
        recorder.step(3, 0.2, phase=NAME, data_wait_s=-0.01, compute_s=0.21, samples=2**40)
        recorder.profile({"profile_id": "p1", "summary": {"top_ops": [{"name": NAME}]},
                          "diagnosis": [{"rule": "input_bound", "message": NAME}], "trace_gz_b64": trace,
                          "note": note})
        assert recorder.flush(10.0)
    finally:
        recorder.close(1.0)

    assert collector.refused == []
    by_kind = {r["kind"]: r for r in collector.records}
    assert sorted(by_kind) == ["job_started", "log", "metric", "profile", "step"]
    started = by_kind["job_started"]
    assert (started["name"], started["attrs"]) == (SHOWN, {SHOWN: SHOWN, "process": process_owner()})
    assert by_kind["log"]["message"] == f"checkpoint {SHOWN}" and by_kind["log"]["attrs"] == {"file": SHOWN}
    assert by_kind["log"]["exception"].rstrip().endswith(f"ValueError: {SHOWN}")
    assert by_kind["metric"]["name"] == f"loss/{SHOWN}"
    step = by_kind["step"]
    assert (step["phase"], step["data_wait_s"], step["compute_s"], step["samples"]) == (SHOWN, 0.0, 0.21, None)
    assert by_kind["profile"]["summary"] == {"top_ops": [{"name": SHOWN}]}
    assert by_kind["profile"]["diagnosis"] == [{"rule": "input_bound", "message": SHOWN}]


def test_a_trace_over_the_collectors_inflated_cap_is_left_out() -> None:
    """gzip makes 256 MiB of a repetitive trace small enough for the wire's cap on the gzip, but
    the collector refuses a trace that inflates past wire.MAX_TRACE_INFLATED, and the whole batch
    with it: the agent leaves such a trace out (the summary still goes)."""
    trace, note = pack_trace(bytes(wire.MAX_TRACE_INFLATED + 1), wire.MAX_TRACE_B64)
    assert trace is None and note is not None and "over the collector's cap" in note
    small, _ = pack_trace(b'{"traceEvents": []}' * 1000, wire.MAX_TRACE_B64)
    assert small is not None and gzip.decompress(base64.b64decode(small)).startswith(b'{"traceEvents"')
