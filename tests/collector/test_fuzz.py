"""Fuzzing the collector as an attacker would: it answers 200 or a 4xx, never a 5xx, and a
refused batch stores nothing.

* schemathesis drives every operation of the live collector's OpenAPI schema, ``/v1/ingest``
  with generated bodies included, as the admin, on a fixed time budget;
* a hypothesis property puts any JSON value into any field of any record kind, between two
  valid records of the same batch, and checks all or nothing was stored.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed (the dev extra)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from jobsight.protocol.wire import FIELDS, now_us  # noqa: E402
from tests.collector.helpers import next_seq  # noqa: E402

SCHEMATHESIS_BUDGET_S = 120


def test_schemathesis_finds_no_server_error(live_collector: Any, tmp_path: Path) -> None:
    binary = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    if binary is None:
        pytest.skip("schemathesis is not installed (the dev extra)")
    result = subprocess.run(
        [binary, "run", f"{live_collector.url}/openapi.json", "--checks", "not_a_server_error",
         "--header", f"Authorization: Bearer {live_collector.token}", "--max-time", str(SCHEMATHESIS_BUDGET_S),
         # One worker: hypothesis' lambda descriptions parse source with ast, which is not
         # thread-safe on CPython 3.11 (a SystemError inside schemathesis, not the server).
         "--max-examples", "40", "--seed", "20261123", "--generation-database", "none", "--workers", "1",
         "--request-timeout", "30", "--no-color", "--report", "junit",
         "--report-junit-path", str(tmp_path / "junit.xml")],
        capture_output=True, text=True, timeout=SCHEMATHESIS_BUDGET_S + 120, cwd=tmp_path,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    report = (tmp_path / "junit.xml").read_text()
    assert "POST /v1/ingest" in report, "the ingest operation was not fuzzed"
    assert "GET /v1/jobs/{job_id}/logs" in report


_json_scalars = (
    st.none() | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70) | st.sampled_from([10**400, -(10**400), 2**63, 2**31, 70000])
    | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([1.7e308, -1.7e308, 5e-324])
    | st.text(max_size=40) | st.sampled_from(["\udcff", "a\x00b", "x" * 70000, "\ud800\udc00"])
)
json_values = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
fields = st.sampled_from([(kind, name) for kind, specs in FIELDS.items() for name in (*specs, "ts", "job", "node")])


def _log(job: str, ts: int, message: str) -> dict[str, Any]:
    return {"kind": "log", "job": job, "ts": ts, "node": "fuzz", "level": "INFO", "message": message}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow])
@given(field=fields, value=json_values)
def test_any_value_in_any_field_is_stored_whole_or_refused(client: Any, db: Any, field: tuple[str, str],
                                                             value: Any) -> None:
    kind, name = field
    job = f"fuzz-{uuid.uuid4().hex[:12]}"
    ts = now_us()
    record: dict[str, Any] = {"kind": kind, "job": job, "ts": ts + 1, "node": "fuzz"}
    record[name] = value
    envelope = {"v": 1, "source": "fuzz", "seq": next_seq(), "records": [_log(job, ts, "before"), record,
                                                                         _log(job, ts + 2, "after")]}
    body = json.dumps(envelope).encode()  # lone surrogates go out as \\udcff escapes, as an attacker's would
    response = client.post("/v1/ingest", content=body)
    assert response.status_code < 500, (kind, name, value, response.text[:500])
    stored = db.execute("SELECT count(*) FROM log_events WHERE job_id = %s AND node = 'fuzz'", (job,)).fetchone()[0]
    if response.status_code == 200:
        assert stored >= 2, (kind, name, value)
    else:
        assert stored == 0, (kind, name, value, response.status_code)
        detail = response.json()["detail"]
        assert detail.get("error"), detail
