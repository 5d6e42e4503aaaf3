"""The dependency rule holds on the tree, and the checker catches a break (so it can fail)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.layout.import_rules import COLLECTOR_ROOMS, SOURCE_ROOTS, import_cycles, module_files, violations

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
        ("agent/shipping/client.py", "from jobsight.collector.store import db",
         "may not import jobsight.collector.store.db"),
        ("agent/training/logs.py", "import jobsight.dashboard.charts", "may not import jobsight.dashboard.charts"),
        ("collector/app.py", "from jobsight.agent.training import logs",
         "may not import jobsight.agent.training.logs"),
        ("collector/ingest/write.py", 'APP = "jobsight.agent.shipping.shipper:Shipper"',
         "may not import by string jobsight.agent.shipping.shipper"),
        ("collector/store/db.py", 'ARGV = ["-m", "jobsight.agent.training.demo"]',
         "by string jobsight.agent.training.demo"),
        ("jobsight/protocol/wire.py", "from jobsight.agent import settings", "may not import jobsight.agent.settings"),
        # The rules room: the agent never imports it, and it imports nothing above the protocol.
        ("agent/training/logs.py", "from jobsight.rules import health", "may not import jobsight.rules.health"),
        ("agent/node/daemon.py", "from jobsight.rules.links import job_page_url",
         "may not import jobsight.rules.links"),
        ("jobsight/protocol/wire.py", "from jobsight.rules import job_states",
         "may not import jobsight.rules.job_states"),
        ("jobsight/rules/health.py", "from jobsight.collector.store import db",
         "may not import jobsight.collector.store.db"),
        ("jobsight/rules/links.py", "import jobsight.dashboard.charts", "may not import jobsight.dashboard.charts"),
        ("agent/node/daemon.py", "from ...collector.store import db", "may not import jobsight.collector.store.db"),
        ("dashboard/charts.py", "from agent.training import logs", "the old top-level name"),
        ("agent/slurm/hooks.py", "import httpx", "standard library only"),
        ("agent/node/host.py", "import pynvml", "only jobsight.agent.node.gpu.nvml imports pynvml"),
        ("agent/node/gpu/sampler.py", "import pynvml", "only jobsight.agent.node.gpu.nvml imports pynvml"),
        ("dashboard/charts.py", "from jobsight.collector.ingest import write",
         "jobsight.dashboard.charts may not import jobsight.collector.ingest.write"),
        # The rooms: an import that points up names the line, both modules and both rooms.
        ("collector/store/db.py", "from jobsight.collector.query import series",
         "jobsight.collector.store.db (store) may not import jobsight.collector.query.series (query)"),
        ("collector/ingest/body.py", "from jobsight.collector.api.errors import error_answer",
         "jobsight.collector.ingest.body (ingest) may not import jobsight.collector.api.errors (api)"),
        ("collector/query/series.py", "def late() -> None:\n    from jobsight.collector.passes import findings",
         "(query) may not import jobsight.collector.passes.findings (passes)"),
        ("collector/config/tiers.py", '_LOG = "jobsight.collector.tiers.compaction"',
         "(config) may not import jobsight.collector.tiers.compaction (tiers)"),
        ("collector/passes/alerts.py", "from jobsight.collector.app import create_app",
         "may not import the entry jobsight.collector.app"),
        ("agent/node/host.py", "from jobsight.agent.training import logs",
         "jobsight.agent.node.host (node) may not import jobsight.agent.training.logs (training)"),
        # The node's rooms: the GPU, power and Kineto rooms below the daemon's core, beside each other.
        ("agent/node/gpu/sampler.py", "from jobsight.agent.node.daemon import NodeDaemon",
         "jobsight.agent.node.gpu.sampler (gpu) may not import jobsight.agent.node.daemon (daemon): "
         "a room imports only rooms below it"),
        ("agent/node/power/sources.py", "from jobsight.agent.node.host import HostSampler",
         "jobsight.agent.node.power.sources (power) may not import jobsight.agent.node.host (host)"),
        ("agent/node/kineto/deciding.py", "from jobsight.agent.node.gpu.reading import GpuReading",
         "jobsight.agent.node.kineto.deciding (kineto) may not import jobsight.agent.node.gpu.reading (gpu): "
         "rooms side by side import nothing of one another"),
        ("agent/node/gpu/reading.py", 'def late() -> None:\n    from jobsight.agent.node.power import energy_split',
         "(gpu) may not import jobsight.agent.node.power.energy_split (power): rooms side by side"),
        ("agent/node/registrations.py", "from jobsight.agent.node.kineto import hooks",
         "jobsight.agent.node.registrations (registrations) may not import jobsight.agent.node.kineto.hooks (kineto)"),
        ("agent/node/attribution.py", '_LOG = "jobsight.agent.node.daemon"',
         "jobsight.agent.node.attribution (attribution) may not import jobsight.agent.node.daemon (daemon)"),
    ],
)
def test_a_forbidden_import_is_reported(tree_copy: Path, file: str, line: str, expected: str) -> None:
    _append(tree_copy / file, line)
    found = violations(tree_copy)
    assert len(found) == 1, found
    assert file in found[0] and expected in found[0], found


def test_the_collector_is_all_rooms_but_its_entry() -> None:
    outside = [module for module in module_files(REPO) if module.startswith("jobsight.collector.")
               and module.split(".")[2] not in COLLECTOR_ROOMS]
    assert outside == ["jobsight.collector.app"]


def test_a_module_outside_the_rooms_is_reported(tree_copy: Path) -> None:
    (tree_copy / "collector" / "helpers.py").write_text("X = 1\n")
    found = violations(tree_copy)
    assert found == ["collector/helpers.py:1: jobsight.collector.helpers is outside the rooms of jobsight.collector "
                     "(config, store, tiers, jobs, ingest, query, passes, api)"]


def test_a_module_outside_the_node_rooms_is_reported(tree_copy: Path) -> None:
    (tree_copy / "agent" / "node" / "helpers.py").write_text("X = 1\n")
    found = violations(tree_copy)
    assert found == ["agent/node/helpers.py:1: jobsight.agent.node.helpers is outside the rooms of jobsight.agent.node "
                     "(registrations, slurm_cgroups, {gpu, power, kineto}, attribution, host, daemon)"]


def test_the_tree_has_no_import_cycles() -> None:
    assert import_cycles(REPO) == []


@pytest.mark.parametrize(
    ("file", "line", "cycle"),
    [
        # schema <- migrate already; one more arrow back makes a cycle within a room.
        ("collector/store/schema.py", "from jobsight.collector.store import migrate",
         ["jobsight.collector.store.migrate", "jobsight.collector.store.schema"]),
        # Under TYPE_CHECKING it is a cycle all the same: a reader follows it round.
        ("agent/training/step_timer.py",
         "if TYPE_CHECKING:\n    from jobsight.agent.training.torch import TorchProfiler",
         ["jobsight.agent.training.step_timer", "jobsight.agent.training.torch"]),
        ("dashboard/identity.py", "from jobsight.dashboard import data",
         ["jobsight.dashboard.data", "jobsight.dashboard.identity"]),
        # Within a node room: the door into NVML importing what reads through it.
        ("agent/node/gpu/nvml.py", "from jobsight.agent.node.gpu import sampler",
         ["jobsight.agent.node.gpu.devices", "jobsight.agent.node.gpu.events", "jobsight.agent.node.gpu.faults",
          "jobsight.agent.node.gpu.nvml", "jobsight.agent.node.gpu.sampler"]),
    ],
)
def test_a_planted_cycle_is_found(tree_copy: Path, file: str, line: str, cycle: list[str]) -> None:
    _append(tree_copy / file, line)
    assert import_cycles(tree_copy) == [cycle]

