"""What the hooks take from ``squeue --json``: for waste policies the batch flag, QOS and comment, each
only when Slurm gave it in its own type (a comment is text, never parsed); Slurm 26.05's answer read as
22.05's; and how squeue is run (``--states=all``, slurmd's ``SLURM_CONF``) and found."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from jobsight.agent.slurm.squeue import SQUEUE, ask_squeue, find_squeue, job_fields, slurm_env
from tests.slurm.squeue_stub import BASE


def answer(**fields: Any) -> dict[str, Any]:
    return {"jobs": [{**BASE, "job_id": 77, **fields}]}


def test_batch_qos_and_comment_come_from_slurms_answer() -> None:
    got = job_fields(answer(batch_flag=False, qos="normal", comment="keep-me BatchFlag=1"), "77")
    assert (got["batch"], got["qos"], got["comment"]) == ("false", "normal", "keep-me BatchFlag=1")
    assert job_fields(answer(batch_flag=True), "77")["batch"] == "true"


def test_missing_or_mistyped_values_are_left_out() -> None:
    got = job_fields(answer(batch_flag="false", qos="", comment=7), "77")
    assert not {"batch", "qos", "comment"} & set(got)


# One job as Slurm 26.05.3's ``squeue --json`` prints it (data_parser v0.0.45, src/plugins/data_parser/v0.0.45/
# parsers.c; the shapes checked against the test cluster's 26.05.3): states as lists, counts as {set, infinite,
# number} (UINT32_NO_VAL), an exit code as an object (PROCESS_EXIT_CODE_VERBOSE), the run's SLUID inside
# step_id; the fields the hooks read and a few beside them.
def _count(number: int, *, set_: bool = True, infinite: bool = False) -> dict[str, Any]:
    return {"set": set_, "infinite": infinite, "number": number}


def _exit(code: int, signal: int = 0) -> dict[str, Any]:
    """As 26.05.3 printed them on the test cluster: ``SUCCESS``, ``ERROR``, or ``SIGNALED`` with no return code."""
    status = ["SIGNALED"] if signal else ["SUCCESS"] if code == 0 else ["ERROR"]
    return {"status": status, "return_code": _count(code, set_=not signal),
            "signal": {"id": _count(signal, set_=bool(signal)), "name": "TERM" if signal == 15 else ""}}


SLURM_26_05: dict[str, Any] = {
    "account": "acct1", "admin_comment": "", "array_job_id": _count(0), "array_task_id": _count(0, set_=False),
    "batch_flag": True, "comment": "", "derived_exit_code": _exit(0), "end_time": _count(1795800400),
    "exit_code": _exit(3), "het_job_id": _count(0), "job_id": 812, "job_state": ["FAILED"], "name": "train",
    "partition": "gpu", "qos": "normal", "restart_cnt": 0, "start_time": _count(1795800340),
    "state_reason": "NonZeroExitCode", "step_id": {"sluid": "s8FXKTA79XAR00", "job_id": _count(812),
                                                   "step_het_component": _count(0, set_=False), "step_id": "entire"},
    "time_limit": _count(30), "user_id": 0, "user_name": "root",
}


def test_a_slurm_26_05_answer_reads_as_22_05s_did() -> None:
    from jobsight.agent.slurm.end_state import end_state

    fields = job_fields({"jobs": [SLURM_26_05]}, "812")
    assert (fields["job_state"], fields["exit_code"], fields["time_limit"], fields["restarts"]) == (
        "FAILED", "3:0", "30", "0")
    assert (fields["batch"], fields["qos"], fields["user_id"]) == ("true", "normal", "0")
    assert not {"array_job_id", "array_task_id", "het_job_id", "comment"} & set(fields)
    assert end_state(fields, 0, None) == ("FAILED", 3)
    # Cancelled, during the epilog: the base state first, then the COMPLETING flag (parsers.c's JOB_STATE
    # flags); signal 15. Unlimited: no time limit.
    cancelled = {**SLURM_26_05, "job_state": ["CANCELLED", "COMPLETING"], "state_reason": "None",
                 "exit_code": _exit(0, 15), "time_limit": _count(0, infinite=True)}
    fields = job_fields({"jobs": [cancelled]}, "812")
    assert "time_limit" not in fields and end_state(fields, 0, 0) == ("CANCELLED", 143)
    # An array task: its own id asked, the array's ids given back.
    task = {**SLURM_26_05, "job_id": 815, "array_job_id": _count(812), "array_task_id": _count(3)}
    assert {k: v for k, v in job_fields({"jobs": [task]}, "815").items() if k.startswith("array")} == {
        "array_job_id": "812", "array_task_id": "3"}


def _squeue_26_05(directory: Path) -> tuple[str, Path]:
    """An ``squeue`` that answers as 26.05 does for an ended job: the job only with ``--states=all``,
    else no job (src/squeue/print.c, ``_filter_job``). It writes its arguments and ``SLURM_CONF`` down."""
    seen = directory / "squeue-called"
    answer = json.dumps({"jobs": [SLURM_26_05], "meta": {"plugin": {"data_parser": "data_parser/v0.0.45"}},
                         "errors": [], "warnings": []})
    script = directory / "squeue"
    script.write_text(f"""#!/bin/sh
printf '%s\\n' "$*" "SLURM_CONF=${{SLURM_CONF:-}}" > {seen}
case " $* " in
    *" --states=all "*) printf '%s\\n' '{answer}' ;;
    *) printf '%s\\n' '{{"jobs": [], "errors": [], "warnings": []}}' ;;
esac
""")
    script.chmod(0o755)
    return str(script), seen


def test_an_ended_job_is_asked_with_all_states_and_slurmds_slurm_conf(tmp_path: Path) -> None:
    """26.05 answers no ended job without ``--states=all``; Slurm's commands find their configuration
    through the ``SLURM_CONF`` slurmd gave the hook (an installation outside /usr), nothing else."""
    squeue, seen = _squeue_26_05(tmp_path)
    env = {"SLURM_CONF": "/opt/slurm-26.05/etc/slurm.conf", "SQUEUE_FORMAT": "%i", "PATH": "/tmp"}
    fields = ask_squeue("812", squeue, 5.0, env)
    assert (fields["job_state"], fields["exit_code"]) == ("FAILED", "3:0")
    args, conf = seen.read_text().splitlines()
    assert args == "--json -j 812 --states=all" and conf == "SLURM_CONF=/opt/slurm-26.05/etc/slurm.conf"
    assert slurm_env(env) == {"PATH": "/usr/bin:/bin", "SLURM_CONF": "/opt/slurm-26.05/etc/slurm.conf"}
    assert slurm_env({"SLURM_CONF": "slurm.conf"}) == slurm_env({}) == {"PATH": "/usr/bin:/bin"}


def test_the_squeue_asked_is_the_sites_or_the_one_beside_slurm_conf(tmp_path: Path) -> None:
    prefix = tmp_path / "slurm-26.05"
    (prefix / "bin").mkdir(parents=True)
    squeue = prefix / "bin" / "squeue"
    squeue.write_text("#!/bin/sh\n")
    squeue.chmod(0o755)
    conf = str(prefix / "etc" / "slurm.conf")
    # hooks.env's JOBSIGHT_SQUEUE first, whatever SLURM_CONF says.
    assert find_squeue({"JOBSIGHT_SQUEUE": "/site/squeue", "SLURM_CONF": conf}) == "/site/squeue"
    if os.geteuid() == 0:  # root's own file is the only one root runs unasked
        assert find_squeue({"SLURM_CONF": conf}) == str(squeue)
        assert find_squeue({"SLURM_CONF": str(prefix / "etc" / "slurm" / "slurm.conf")}) == str(squeue)
        squeue.chmod(0o775)  # group-writable: not root's alone
        assert find_squeue({"SLURM_CONF": conf}) == SQUEUE
        squeue.chmod(0o755)
        os.chown(squeue, 65534, 65534)
    assert find_squeue({"SLURM_CONF": conf}) == SQUEUE
    # The system's Slurm (/etc/slurm), none beside a relative path, none given: /usr/bin/squeue.
    assert find_squeue({"SLURM_CONF": "/etc/slurm/slurm.conf"}) == find_squeue({}) == SQUEUE
    assert find_squeue({"SLURM_CONF": "slurm-26.05/etc/slurm.conf"}) == SQUEUE
