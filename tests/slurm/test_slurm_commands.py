"""The real-Slurm tests run on whichever Slurm ``JOBSIGHT_TEST_SLURM_PREFIX`` names (Debian's 22.05 in
``/usr``, 26.05 built into ``/opt/slurm-26.05`` in CI): every Slurm command comes from
:mod:`tests.slurm.slurm_commands`. A test that ran ``/usr/bin/sbatch`` itself would submit to Debian's
Slurm (or fail to reach 26.05's controller) while the rest of the test read the other one."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

COMMANDS = ("sbatch", "salloc", "srun", "scancel", "scontrol", "squeue", "sacct", "sinfo", "slurmctld", "slurmd")
OWN_PATH = re.compile(r"[\"']/usr/s?bin/(?:" + "|".join(COMMANDS) + r")[\"']")
"""A path of its own, as a string a test would run (prose that names one is fine)."""
ALLOWED = {Path(__file__).with_name("slurm_commands.py"), Path(__file__)}


def test_no_test_runs_a_slurm_command_by_a_path_of_its_own() -> None:
    found = []
    for path in sorted((REPO / "tests" / "slurm").glob("*.py")):
        if path in ALLOWED:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OWN_PATH.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, "use tests/slurm/slurm_commands.py:\n" + "\n".join(found)


def _paths(prefix: str | None) -> dict[str, object]:
    """What slurm_commands gives in a fresh interpreter with the prefix variable set (or unset)."""
    code = ("import json; from tests.slurm import slurm_commands as c; "
            "print(json.dumps({'squeue': c.SQUEUE, 'sbatch': c.SBATCH, 'slurmd': c.SLURMD, "
            "'setup': c.setup_environment()}))")
    env = {"PATH": "/usr/bin:/bin"} | ({"JOBSIGHT_TEST_SLURM_PREFIX": prefix} if prefix is not None else {})
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
                         check=True).stdout
    return json.loads(out)  # type: ignore[no-any-return]


def test_the_prefix_names_every_command_and_the_cluster_setup() -> None:
    assert _paths("/opt/slurm-26.05") == {
        "squeue": "/opt/slurm-26.05/bin/squeue", "sbatch": "/opt/slurm-26.05/bin/sbatch",
        "slurmd": "/opt/slurm-26.05/sbin/slurmd", "setup": {"SLURM_PREFIX": "/opt/slurm-26.05"}}
    # Unset or empty: Debian's Slurm, and setup_cluster.sh's own default.
    for prefix in (None, ""):
        assert _paths(prefix) == {"squeue": "/usr/bin/squeue", "sbatch": "/usr/bin/sbatch",
                                  "slurmd": "/usr/sbin/slurmd", "setup": {}}


def test_a_job_whose_epilog_runs_is_completing_on_both_versions() -> None:
    """26.05 lists the end state first (``["COMPLETED", "COMPLETING"]``, seen on the test cluster with a
    3 s epilog); 22.05 said ``"COMPLETING"``. The tests' waits must not end before the epilog did."""
    from tests.slurm.slurm_commands import _state_flags

    later = {"jobs": [{"job_id": 7, "job_state": ["COMPLETED", "COMPLETING"]}, {"job_id": 8, "job_state": ["RUNNING"]}]}
    assert "COMPLETING" in _state_flags(later, "7")
    assert _state_flags(later, "8") == ["RUNNING"] and _state_flags(later, "9") == []
    assert _state_flags({"jobs": [{"job_id": 7, "job_state": "COMPLETING"}]}, "7") == []
