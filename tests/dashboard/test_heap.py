"""The dashboard server's heap (``jobsight.dashboard.heap``): once a page's run has imported what it uses,
those objects are permanent, so the collector's full collections during later page loads look only at what
pages made (docs/scale.md)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from jobsight.dashboard import heap
from tests.conftest import REPO

# Run in a process of its own: a freeze is for the whole process, and what the probe counts is the
# process's objects.
PROBE = """
import gc, json
from jobsight.dashboard import heap
first = heap.settle()
frozen = gc.get_freeze_count()
oldest = len(gc.get_objects(generation=2))
again = heap.settle()
import pandas, altair
grown = heap.settle()
print(json.dumps({"first": first, "frozen": frozen, "oldest": oldest, "again": again, "grown": grown,
                  "frozen_after": gc.get_freeze_count()}))
"""


def test_what_is_loaded_is_frozen_once_and_what_a_run_adds_is_frozen_after_it() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=True)
    settled = json.loads(done.stdout.strip().splitlines()[-1])
    assert settled["first"] is True and settled["frozen"] > 1_000 and settled["oldest"] == 0
    # Nothing new loaded: no collection, no freeze (a page's every rerun calls it).
    assert settled["again"] is False
    # pandas and Altair are hundreds of thousands of objects more, frozen with the run that loaded them.
    assert settled["grown"] is True and settled["frozen_after"] > settled["frozen"] + 100_000


def test_a_page_run_settles_what_it_loaded(app_as: Callable[..., AppTest], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # A module this process has never loaded: whatever ran before, the heap is not settled now.
    name = f"heap_probe_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module(name)
    app_as("alice", "views/job.py", job="a1")
    assert heap.settle() is False, "the page's run did not settle the heap after it"
