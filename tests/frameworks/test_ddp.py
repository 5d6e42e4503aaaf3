"""Two-process DDP on gloo: both ranks report, and the profile breakdown sees the all-reduce."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from tests.frameworks.ddp_run import run_two_rank_ddp  # noqa: E402
from tests.frameworks.support import api, rows, wait_for  # noqa: E402


def test_two_ranks_report_and_see_communication(live_collector: Any, db: Any, job_id: str, tmp_path: Path) -> None:
    run_two_rank_ddp(live_collector, job_id, tmp_path)
    ranks = rows(db, "SELECT rank, count(*) FROM steps WHERE job_id = %s GROUP BY rank ORDER BY rank", job_id)
    assert ranks == [(0, 6), (1, 6)]
    profiles = wait_for(lambda: (p := api(live_collector, f"/v1/jobs/{job_id}/profiles")["profiles"]) and len(p) == 2
                        and p)
    assert sorted(p["rank"] for p in profiles) == [0, 1]
    for profile in profiles:
        times = profile["summary"]["breakdown"]
        assert times["communication_us"] > 0, times
        assert times["comm_overlap"] is not None
    diagnosis = api(live_collector, f"/v1/jobs/{job_id}/diagnosis")
    assert diagnosis["steps_considered"] == 12
