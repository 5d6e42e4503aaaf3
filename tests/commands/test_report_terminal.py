"""``jobsight report`` on a terminal: what a job and its user wrote is printed as text, never as
terminal commands.

A job's name is the user's: ``sbatch -J $'\\e]0;owned\\a…'`` puts an OSC sequence (sets the terminal's
title), a one-byte CSI (0x9b, read by terminals in 8-bit mode), a carriage return and a newline that
forge a line of the report, and a right-to-left override into it. Against a real collector (a
uvicorn subprocess) and the real command, as a user runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import uuid
from typing import Any

from jobsight.protocol.terminal_text import UNSAFE, terminal_safe, terminal_safe_tree
from jobsight.protocol.wire import now_us
from tests.collector.helpers import gz
from tests.conftest import REPO, LiveCollector

FORGED = "\n      Job ID: 4242\n           State: CANCELLED by jobsight"
NAME = "train\x1b]0;owned\x07\x9b2J\rJob Name: innocent" + FORGED + "\u202egnp.exe"
USER = "alice\x1b[8m"
NODE = "n1\x1b[2K"


def test_every_unsafe_character_is_shown_as_its_escape() -> None:
    assert terminal_safe("a\x1bb\x9bc\x07d\re\nf\tg\x00h\x7f") == "a\\x1bb\\x9bc\\x07d\\re\\nf\\tg\\x00h\\x7f"
    assert terminal_safe("x\u202ey\u2066z\u200b\u2028\ufeff") == "x\\u202ey\\u2066z\\u200b\\u2028\\ufeff"
    assert terminal_safe("lone \ud800") == "lone \\ud800"
    # Letters of any script, emoji and ordinary punctuation stay as they are.
    assert terminal_safe("Zoë 訓練 🚀 a\\b %s {x}") == "Zoë 訓練 🚀 a\\b %s {x}"
    assert terminal_safe_tree({"k\x1b": ["v\x9b", 3, None, {"n": "\n"}]}) == {"k\\x1b": ["v\\x9b", 3, None,
                                                                                        {"n": "\\n"}]}


def _post(collector: LiveCollector, records: list[dict[str, Any]]) -> None:
    request = urllib.request.Request(f"{collector.url}/v1/ingest", data=gz(records, source=f"t-{uuid.uuid4().hex}"),
                                     headers={"Content-Encoding": "gzip", "Authorization": f"Bearer {collector.token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def _report(collector: LiveCollector, job: str, *extra: str) -> str:
    env = {**os.environ, "JOBSIGHT_TOKEN": collector.token, "JOBSIGHT_URL": collector.url}
    env.pop("JOBSIGHT_CLUSTER", None)
    done = subprocess.run([sys.executable, "-m", "jobsight", "report", job, *extra], env=env, cwd=REPO,
                          capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.decode("utf-8")  # strict: a lone surrogate or a broken byte would fail here


def test_a_jobs_name_cannot_drive_the_terminal_or_forge_a_line(live_collector: LiveCollector) -> None:
    job = f"t{uuid.uuid4().hex[:12]}"
    t0 = now_us() - 120_000_000
    _post(live_collector, [
        {"kind": "job_started", "job": job, "ts": t0, "node": NODE, "user": USER, "name": NAME,
         "partition": "gpu\x1b[1A", "nodes": [NODE], "gpus": ["0"]},
        {"kind": "gpu_sample", "job": job, "ts": t0 + 1_000_000, "node": NODE, "gpu_index": 0,
         "gpu_uuid": "GPU-0", "util_gpu": 50.0, "power_w": 300.0, "mem_used": 2**30, "mem_total": 80 * 2**30},
        {"kind": "job_ended", "job": job, "ts": t0 + 60_000_000, "node": NODE, "state": "completed",
         "exit_code": 0},
    ])
    text = _report(live_collector, job)
    assert UNSAFE.search(text.replace("\n", "")) is None, repr(text)
    lines = text.splitlines()
    # The name is one line, its escapes visible; nothing it held became a line of its own.
    [name] = [line for line in lines if line.lstrip().startswith("Job Name:")]
    assert name == f"{'Job Name':>15}: " + terminal_safe(NAME)
    assert "\\x1b]0;owned\\x07\\x9b2J\\rJob Name: innocent\\n      Job ID: 4242" in name
    assert [line.strip() for line in lines if line.lstrip().startswith("Job ID:")] == [f"Job ID: {job}"]
    assert [line.strip() for line in lines if line.lstrip().startswith("State:")] == ["State: COMPLETED"]
    assert f"{'User/Account':>15}: alice\\x1b[8m/unknown" in lines
    assert f"{'Partition':>15}: gpu\\x1b[1A" in lines
    assert any(line.strip().startswith("n1\\x1b[2K (GPU 0)") for line in lines), text

    # --json: the same strings as JSON escapes, ASCII only, and they read back as the job's own.
    raw = _report(live_collector, job, "--json")
    assert raw.isascii() and UNSAFE.search(raw.replace("\n", "")) is None
    parsed: dict[str, Any] = json.loads(raw)
    assert parsed["job"]["name"] == NAME and parsed["job"]["user_name"] == USER
