"""The dependency rule of the ``jobsight`` namespace, read from the source with ``ast``.

Who may import whom (project modules only; the standard library is always allowed):

* ``jobsight.protocol``: what both sides share; imports nothing else of the project.
* ``jobsight.agent``: the protocol and itself; never the collector, dashboard or commands.
* ``jobsight.collector``: the protocol and itself.
* ``jobsight.dashboard``: the protocol, the collector (its query layer) and itself.
* ``jobsight.migrations``: the protocol, the collector (the schema) and itself.
* ``jobsight.cli`` and ``jobsight.commands``: anything; they are the composition root.

An import is an ``import`` statement (at any depth, relative ones resolved) or a string
constant that names a project module (``"jobsight.collector.app:create_app"``,
``["-m", "jobsight.agent.training.demo"]``, ``importlib.import_module("…")``). The old
top-level names (``agent``, ``collector``, ``dashboard``, ``migrations``) are refused
everywhere. Rooms that run on compute nodes without extras (the protocol, the agent's
shipping, node and slurm rooms) import only the standard library, except pynvml, which only
the NVML module imports, lazily, and orjson, which only the wire module imports, and works
without (tests/protocol/test_wire_encoding.py).
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Real folders of the repository -> their place in the namespace.
SOURCE_ROOTS: dict[str, str] = {
    "jobsight": "jobsight",
    "agent": "jobsight.agent",
    "collector": "jobsight.collector",
    "dashboard": "jobsight.dashboard",
    "migrations": "jobsight.migrations",
}
LINKED = {"agent", "collector", "dashboard", "migrations"}  # jobsight/<name> is a link to ../<name>
OLD_TOP_LEVEL = ("agent", "collector", "dashboard", "migrations")

ALLOWED: list[tuple[str, tuple[str, ...]]] = [
    # (importer prefix, project prefixes it may import); the first matching prefix decides
    ("jobsight.protocol", ("jobsight.protocol",)),
    ("jobsight.agent", ("jobsight.protocol", "jobsight.agent")),
    ("jobsight.collector", ("jobsight.protocol", "jobsight.collector")),
    ("jobsight.dashboard", ("jobsight.protocol", "jobsight.collector", "jobsight.dashboard")),
    ("jobsight.migrations", ("jobsight.protocol", "jobsight.collector", "jobsight.migrations")),
    ("jobsight.commands", ("jobsight",)),
    ("jobsight.cli", ("jobsight",)),
    ("jobsight.__main__", ("jobsight.cli",)),
    ("jobsight", ()),
]
STDLIB_ONLY = ("jobsight.protocol", "jobsight.agent.shipping", "jobsight.agent.node", "jobsight.agent.slurm",
               "jobsight.agent.settings", "jobsight.agent.atomic_files")
ORJSON_HOME = "jobsight.protocol.wire"  # optional: a faster batch encoder, when the agent extra brought it
PYNVML_HOME = "jobsight.agent.node.nvml"
_DOTTED = re.compile(r"^(jobsight(?:\.\w+)+)(?::\w+)?$")


@dataclass(frozen=True)
class Import:
    module: str
    """The module that imports."""
    target: str
    """What it imports, absolute."""
    line: int
    by_string: bool


def module_files(repo: Path) -> dict[str, Path]:
    """Every project module by its installed name, read from the real folders (not the links)."""
    found: dict[str, Path] = {}
    for folder, package in SOURCE_ROOTS.items():
        base = repo / folder
        for path in sorted(base.rglob("*.py")):
            relative = path.relative_to(base)
            if folder == "jobsight" and relative.parts[0] in LINKED:
                continue
            parts = list(relative.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".")
    if not is_package:
        base.pop()
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def imports_of(module: str, path: Path, known: set[str]) -> Iterator[Import]:
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, node.lineno, False)
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                target = _resolve(module, is_package, node.level, node.module)
            for alias in node.names:
                full = f"{target}.{alias.name}"
                yield Import(module, full if full in known else target, node.lineno, False)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _DOTTED.match(node.value.strip())
            if match and match.group(1) in known:  # a module, not a logger name like "jobsight.slurm"
                yield Import(module, match.group(1), node.lineno, True)
            elif re.match(rf"^({'|'.join(OLD_TOP_LEVEL)})\.\w+(\.\w+)*(:\w+)?$", node.value.strip()):
                head = node.value.split(":")[0]
                if "jobsight." + head in known:  # "agent.cli", not "agent.toml" or "collector.log"
                    yield Import(module, head, node.lineno, True)


def _project_target(target: str, known: set[str]) -> str | None:
    """The project module ``target`` names (or its nearest known parent); ``None`` outside the project."""
    if target != "jobsight" and not target.startswith("jobsight."):
        return None
    parts = target.split(".")
    while parts and ".".join(parts) not in known:
        parts.pop()
    return ".".join(parts) if parts else target


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(repo: Path) -> list[str]:
    """Every import that breaks the rule, as ``path:line: message``."""
    files = module_files(repo)
    known = set(files)
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    problems: list[str] = []
    for module, path in files.items():
        where = path.relative_to(repo)
        allowed = next(targets for prefix, targets in ALLOWED if _within(module, prefix))
        for item in imports_of(module, path, known):
            how = "by string " if item.by_string else ""
            head = item.target.split(".")[0]
            if head in OLD_TOP_LEVEL:
                problems.append(f"{where}:{item.line}: imports {how}the old top-level name {item.target!r}")
                continue
            target = _project_target(item.target, known)
            if target is not None:
                if not any(_within(target, ok) for ok in allowed):
                    problems.append(f"{where}:{item.line}: {module} may not import {how}{target}")
                continue
            if item.by_string:
                continue
            if head == "pynvml":
                if module != PYNVML_HOME:
                    problems.append(f"{where}:{item.line}: only {PYNVML_HOME} imports pynvml")
                continue
            if head == "orjson" and module == ORJSON_HOME:
                continue
            if head not in stdlib and any(_within(module, room) for room in STDLIB_ONLY):
                problems.append(f"{where}:{item.line}: {module} runs on nodes with the standard library only, "
                                f"but imports {item.target}")
    return problems
