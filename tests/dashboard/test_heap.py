"""The dashboard server's heap (``jobsight.dashboard.heap``): once the server has imported what its pages
use, those objects are permanent, so the collector's full collections during page loads look only at
what the pages made. Run in a process of its own: freezing is for the whole process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO

PROBE = """
import gc, json, sys
from jobsight.dashboard import heap
frozen = heap.settle()
print(json.dumps({"frozen": frozen, "oldest": len(gc.get_objects(generation=2)),
                  "modules": [m for m in heap.PAGE_MODULES + ("pandas", "altair", "pyarrow") if m in sys.modules]}))
"""


def _settled(env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120, check=True)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_what_the_pages_import_is_left_out_of_every_collection() -> None:
    settled = _settled({"JOBSIGHT_DATABASE_URL": "postgresql://reader@127.0.0.1/jobsight"})
    assert settled["modules"] == ["jobsight.dashboard.data", "jobsight.dashboard.charts", "jobsight.dashboard.tables",
                                  "jobsight.dashboard.views.job_health", "jobsight.dashboard.views.job_actions",
                                  "jobsight.dashboard.views.job_epochs", "pandas", "altair", "pyarrow"]
    frozen, oldest = settled["frozen"], settled["oldest"]
    assert isinstance(frozen, int) and isinstance(oldest, int)
    # pandas, Altair and Streamlit are hundreds of thousands of objects; none is left for a full collection.
    assert frozen > 100_000 and oldest == 0


def test_settings_that_do_not_load_leave_their_modules_to_the_page() -> None:
    """The data layer reads the settings as it is imported: with settings that do not load, the server still
    starts (and the app says what is wrong on every page), with the rest settled."""
    settled = _settled({"JOBSIGHT_DASHBOARD_CACHE_TTL_S": "0"})
    assert "jobsight.dashboard.data" not in settled["modules"]
    assert "jobsight.dashboard.charts" in settled["modules"] and "altair" in settled["modules"]
    assert isinstance(settled["frozen"], int) and settled["frozen"] > 100_000


def test_the_server_settles_its_heap_as_it_starts() -> None:
    probe = "import gc, jobsight.dashboard.serve; print(gc.get_freeze_count())"
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "JOBSIGHT_DATABASE_URL": "postgresql://reader@127.0.0.1/jobsight"},
                          check=True)
    assert int(done.stdout.strip().splitlines()[-1]) > 100_000
