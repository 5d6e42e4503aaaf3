"""The dependency rule holds on the tree, and the checker catches a break (so it can fail)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.layout.import_rules import SOURCE_ROOTS, module_files, violations

REPO = Path(__file__).resolve().parents[2]


def test_the_tree_keeps_the_dependency_rule() -> None:
    assert violations(REPO) == []


def test_every_folder_is_mounted_in_the_namespace() -> None:
    for folder in SOURCE_ROOTS:
        if folder != "jobsight":
            link = REPO / "jobsight" / folder
            assert link.is_symlink() and link.resolve() == (REPO / folder).resolve(), link
    modules = module_files(REPO)
    assert "jobsight.protocol.wire" in modules and "jobsight.agent.shipping.shipper" in modules


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    for folder in SOURCE_ROOTS:
        shutil.copytree(REPO / folder, tmp_path / folder, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + "\n" + text + "\n")


@pytest.mark.parametrize(
    ("file", "line", "expected"),
    [
        ("agent/shipping/client.py", "from jobsight.collector.store import db", "may not import jobsight.collector.store.db"),
        ("agent/training/logs.py", "import jobsight.dashboard.charts", "may not import jobsight.dashboard.charts"),
        ("collector/app.py", "from jobsight.agent.training import logs",
         "may not import jobsight.agent.training.logs"),
        ("collector/ingest/write.py", 'APP = "jobsight.agent.shipping.shipper:Shipper"',
         "may not import by string jobsight.agent.shipping.shipper"),
        ("collector/store/db.py", 'ARGV = ["-m", "jobsight.agent.training.demo"]',
         "by string jobsight.agent.training.demo"),
        ("jobsight/protocol/wire.py", "from jobsight.agent import settings", "may not import jobsight.agent.settings"),
        ("agent/node/daemon.py", "from ...collector.store import db", "may not import jobsight.collector.store.db"),
        ("dashboard/charts.py", "from agent.training import logs", "the old top-level name"),
        ("agent/slurm/hooks.py", "import httpx", "standard library only"),
        ("agent/node/host.py", "import pynvml", "only jobsight.agent.node.nvml imports pynvml"),
    ],
)
def test_a_forbidden_import_is_reported(tree_copy: Path, file: str, line: str, expected: str) -> None:
    _append(tree_copy / file, line)
    found = violations(tree_copy)
    assert len(found) == 1, found
    assert file in found[0] and expected in found[0], found
