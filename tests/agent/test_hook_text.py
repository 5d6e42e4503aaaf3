"""What the hooks write and export, unit by unit. The prolog's user-chosen strings (a job's name; its
account where accounting does not enforce it) reach Python as lone surrogates when they are not UTF-8:
the registration carries them as the wire takes them, instead of being refused whole. The run's SLUID
only in Slurm's form; the node name a task prolog exports only as a plain host name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobsight.agent.slurm.hooks import _text
from jobsight.protocol import wire


def test_bytes_that_are_not_utf8_become_text_the_wire_takes() -> None:
    raw = b"train\xff\xfe run".decode("utf-8", "surrogateescape")  # as os.environ holds them
    record = {"kind": "job_started", "job": "7", "ts": wire.now_us(), "name": raw, "account": raw}
    with pytest.raises(wire.WireError, match="surrogate"):
        wire.validate_record(record, 0)
    cleaned = {**record, "name": _text(raw), "account": _text(raw)}
    assert wire.validate_record(cleaned, 0)["name"] == "train\\xff\\xfe run"
    assert (_text(None), _text(""), _text("plain")) == (None, None, "plain")


def _task_prolog(env: dict[str, str]) -> list[str]:
    from jobsight.agent.settings import load_agent_settings
    from jobsight.agent.slurm.hooks import load_hook_settings, task_prolog_lines

    env = {"SLURM_JOB_ID": "41", "JOBSIGHT_URL": "http://collector:8787", "JOBSIGHT_TOKEN_DIR": "/nonexistent",
           "JOBSIGHT_KINETO_DAEMON": "0", **env}
    return task_prolog_lines(env, load_agent_settings(env), load_hook_settings(env))


def test_the_task_prolog_gives_a_job_slurms_node_name() -> None:
    """A job's processes record the node as the prolog registered it (hooks.env's JOBSIGHT_NODE, else
    SLURMD_NODENAME), not ``socket.gethostname()``: a fully qualified host name maps no rank to a GPU."""
    assert "export JOBSIGHT_NODE=gpu01" in _task_prolog({"SLURMD_NODENAME": "gpu01"})
    both = _task_prolog({"SLURMD_NODENAME": "gpu01", "JOBSIGHT_NODE": "gpu01-ib"})
    assert [line for line in both if "NODE" in line] == ["export JOBSIGHT_NODE=gpu01-ib"]
    assert not [line for line in _task_prolog({}) if "NODE" in line]
    # Only a plain host name: a value the shell or Slurm's export parser could read otherwise is left out,
    # and the other exports stay.
    for bad in ("gpu 01", "gpu01;id", "gpu01=x", "-gpu01", "gpu01/x", "g" * 65, "gpu01\\"):
        lines = _task_prolog({"SLURMD_NODENAME": bad})
        assert not [line for line in lines if "NODE" in line], bad
        assert "export JOBSIGHT_JOB_ID=41" in lines


def test_the_runs_sluid_is_taken_only_as_slurmd_prints_it(tmp_path: Path) -> None:
    from jobsight.agent.node.registrations import Registration, read_registration, write_registration
    from jobsight.agent.slurm.job import sluid_from_env

    # The example, and one the test cluster's 26.05.3 gave a job.
    for good in ("s8FXKTA79XAR00", "s6P9M8F0WD8200"):
        assert sluid_from_env({"SLURM_JOB_SLUID": good}) == good
    # 22.05 gives none; Slurm never prints lower case, O/I/L/U or a top digit above F (sluid.c print_sluid).
    for bad in (None, "", "s8fxkta79xar00", "s8FXKTA79XAR0O", "sG000000000000", "S8FXKTA79XAR00",
                "s8FXKTA79XAR00/..", "812"):
        env = {} if bad is None else {"SLURM_JOB_SLUID": bad}
        assert sluid_from_env(env) is None, bad
    # Kept in the registration (the cgroup reader matches a SLUID folder through it) and read back.
    registration = Registration(cluster="c", job_id="812", node="vm", started_us=1, sluid="s8FXKTA79XAR00")
    write_registration(tmp_path, registration)
    assert read_registration(tmp_path, "812") == registration
    assert json.loads((tmp_path / "812.json").read_text())["sluid"] == "s8FXKTA79XAR00"
    # An older prolog's file has none; a garbled value loses the field, never the job.
    write_registration(tmp_path, Registration(cluster="c", job_id="813", node="vm", started_us=1))
    assert "sluid" not in json.loads((tmp_path / "813.json").read_text())
    garbled = {**json.loads((tmp_path / "812.json").read_text()), "sluid": "s8FXKTA79XAR00/step_0"}
    assert Registration.from_dict(garbled).sluid is None and Registration.from_dict(garbled).job_id == "812"


def test_the_wire_takes_a_sluid_in_job_started_only_in_slurms_form() -> None:
    record = {"kind": "job_started", "job": "812", "ts": wire.now_us(), "sluid": "s8FXKTA79XAR00"}
    assert wire.validate_record(record, 0)["sluid"] == "s8FXKTA79XAR00"
    for bad in ("s8fxkta79xar00", "job_812", "s8FXKTA79XAR000", 812):
        with pytest.raises(wire.WireError, match="SLUID|expected a string"):
            wire.validate_record({**record, "sluid": bad}, 0)
