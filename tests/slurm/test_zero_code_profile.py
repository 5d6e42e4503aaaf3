"""Zero-code profiling on the real test cluster: a job whose script imports nothing of jobsight
(a plain PyTorch loop) is profiled from the job page's "Profile the next N steps" form. The task
prolog exports ``KINETO_USE_DAEMON=1``; the node daemon (tests/slurm/test_e2e.py's ``cluster``
fixture) answers the job's profiler and ships the trace under the job, with its rank and pid."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from tests.slurm.job_page import open_job_page
from tests.slurm.slurm_commands import SBATCH, SCANCEL
from tests.slurm.test_e2e import E2E_DIR, Cluster, cluster, job_state  # noqa: F401 (the fixture)

pytest.importorskip("torch", reason="torch is not installed (pip install 'jobsight[frameworks]')")

PLAIN_LOOP = textwrap.dedent("""
    import time, torch
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(32, 64)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        optimizer.zero_grad()
        model(batch).sum().backward()
        optimizer.step()
        time.sleep(0.05)
""")


@pytest.mark.slurm
def test_a_job_without_the_callback_is_profiled_from_the_job_page(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    script = E2E_DIR / "work" / "plain_loop.py"
    script.write_text(PLAIN_LOOP)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(E2E_DIR / "home"), "LANG": "C.UTF-8"}
    submitted = subprocess.run(
        [SBATCH, "--parsable", "--gres=gpu:1", "-J", "plain", "-t", "5", "-D", str(E2E_DIR / "work"),
         "-o", str(E2E_DIR / "out" / "%j.out"), "--wrap", f"exec {sys.executable} {script}"],
        env=env, capture_output=True, text=True, timeout=30)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    try:
        cluster.wait_for(f"job {job} registered", lambda: bool(cluster.scalar(
            "SELECT count(*) FROM jobs WHERE job_id = %s AND state = 'running'", job)))
        # The job page, as an admin sees it, on its profiles with the form a user fills in.
        at = open_job_page(cluster.database_url, job, monkeypatch, details="profiles")
        at.number_input[0].set_value(3)
        next(b for b in at.button if b.label == "Request profile").click().run()
        assert any("Profile request" in s.value for s in at.success)
        started = time.monotonic()
        cluster.wait_for(f"a profile of job {job}", lambda: bool(cluster.scalar(
            "SELECT count(*) FROM profiles WHERE job_id = %s", job)), timeout=45)
        took = time.monotonic() - started
    finally:
        subprocess.run([SCANCEL, job], timeout=10, check=False)
    rank, pid, summary = cluster.query("SELECT rank, pid, summary FROM profiles WHERE job_id = %s", job)[0]
    assert rank == 0 and pid > 0 and summary["source"] == "kineto", summary
    assert any(op["name"].startswith("aten::") for op in summary["ops_by_self_cpu"])
    assert cluster.scalar("SELECT state FROM profile_requests WHERE job_id = %s", job) == "done"
    assert took < 45
