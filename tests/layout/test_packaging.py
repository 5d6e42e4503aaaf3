"""What a user installs and imports: one ``jobsight`` namespace, nothing else top-level, and a
training folder with its own ``agent.py`` does not break the callback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.frameworks.support import api, wait_for

REPO = Path(__file__).resolve().parents[2]
OLD_TOP_LEVEL = ("agent", "collector", "dashboard", "migrations")


SOURCE = ("pyproject.toml", "README.md", "jobsight", "agent", "collector", "dashboard", "migrations")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy of the sources (links kept as links), so setuptools' build/ and
    # egg-info stay out of the working tree.
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in SOURCE:
        path = REPO / name
        if path.is_dir() and not path.is_symlink():
            shutil.copytree(path, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, source / name, follow_symlinks=False)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(out),
         str(source)], check=True, timeout=300, cwd=out,
    )
    (built,) = out.glob("jobsight-*.whl")
    return built


def test_the_wheel_holds_only_the_jobsight_namespace(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"jobsight", next(t for t in tops if t.endswith(".dist-info"))}, tops
    for room in ("agent/shipping/shipper.py", "agent/node/gpu/nvml.py", "agent/slurm/hooks.py",
                 "agent/training/lightning.py", "collector/app.py", "dashboard/app.py",
                 "migrations/versions/0001_initial_schema.py", "migrations/script.py.mako", "protocol/wire.py"):
        assert f"jobsight/{room}" in names, room


def test_agent_extra_install_in_a_fresh_venv(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # --no-deps: the agent extra's one dependency, nvidia-ml-py, is loaded lazily by the NVML module.
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
                   check=True, timeout=300)
    probe = textwrap.dedent("""
        import importlib.util, sys, sysconfig, os
        import jobsight.agent.shipping.shipper, jobsight.agent.node.daemon, jobsight.agent.slurm.hooks
        import jobsight.agent.training.run_records, jobsight.protocol.wire, jobsight.protocol.tokens
        site = sysconfig.get_paths()["purelib"]
        print(" ".join(sorted(os.listdir(site))))
        for name in ("agent", "collector", "dashboard", "migrations"):
            assert importlib.util.find_spec(name) is None, name
        assert "fastapi" not in sys.modules and "psycopg" not in sys.modules
    """)
    listing = subprocess.run([str(python), "-c", probe], check=True, timeout=60, cwd=tmp_path,
                             capture_output=True, text=True).stdout.split()
    for name in OLD_TOP_LEVEL:
        assert name not in listing, listing
    assert "jobsight" in listing
    # The console script answers without the collector's dependencies installed.
    usage = subprocess.run([str(venv / "bin" / "jobsight"), "slurm", "--help"], timeout=60, capture_output=True,
                           text=True)
    assert usage.returncode == 0 and "prolog" in usage.stdout, usage.stderr


SCRIPT = '''
# The user's own agent.py, collector.py and dashboard/, imported by name as their script would.
agent = __import__("agent")
collector = __import__("collector")
dashboard = __import__("dashboard")

import lightning.pytorch as pl
import torch

from jobsight.agent.training.lightning import JobsightCallback


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


x = torch.randn(32, 4)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, callbacks=[JobsightCallback()], logger=False,
                     enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
trainer.fit(Model(), data)
assert agent.POLICY == "ppo" and collector.Collector.__name__ == "Collector" and dashboard.PORT == 6006
print("fit done")
'''


def test_a_training_folder_with_its_own_agent_module(live_collector: Any, tmp_path: Path) -> None:
    pytest.importorskip("lightning.pytorch")
    folder = tmp_path / "rl-project"
    (folder / "dashboard").mkdir(parents=True)
    (folder / "agent.py").write_text('POLICY = "ppo"\n')
    (folder / "collector.py").write_text("class Collector:\n    pass\n")
    (folder / "dashboard" / "__init__.py").write_text("PORT = 6006\n")
    (folder / "train.py").write_text(SCRIPT)
    job = f"shadow-{os.getpid()}"
    env = {**os.environ, "JOBSIGHT_URL": live_collector.url, "JOBSIGHT_TOKEN": live_collector.token,
           "JOBSIGHT_JOB_ID": job, "JOBSIGHT_SPOOL_DIR": str(tmp_path / "spool"), "JOBSIGHT_BATCH_AGE_S": "0.1",
           "PYTHONPATH": ""}
    result = subprocess.run([sys.executable, "train.py"], cwd=folder, env=env, capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "fit done" in result.stdout
    steps = wait_for(lambda: api(live_collector, f"/v1/jobs/{job}/steps")["series"])
    assert len(steps) >= 1
