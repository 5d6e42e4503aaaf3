"""The dependency rule of the ``jobsight`` namespace, read from the source with ``ast``.

Who may import whom (project modules only; the standard library is always allowed):

* ``jobsight.protocol``: the wire contract both sides share; imports nothing else of the project.
* ``jobsight.rules``: the server's rules and wording (health, hardware causes, report and energy
  text, job states, links): the protocol and itself.
* ``jobsight.agent``: the protocol and itself; never the rules, collector, dashboard or commands.
* ``jobsight.collector``: the protocol, the rules and itself.
* ``jobsight.dashboard``: the protocol, the rules, the collector's query, store and config rooms,
  and itself.
* ``jobsight.migrations``: the protocol, the collector's store (the schema) and itself.
* ``jobsight.cli`` and ``jobsight.commands``: anything; they are the composition root.

An import is an ``import`` statement (at any depth, relative ones resolved) or a string
constant that names a project module (``"jobsight.collector.app:create_app"``,
``["-m", "jobsight.agent.training.demo"]``, ``importlib.import_module("…")``). The old
top-level names (``agent``, ``collector``, ``dashboard``, ``migrations``) are refused
everywhere. Rooms that run on compute nodes without extras (the protocol, the agent's
shipping, node and slurm rooms) import only the standard library, except pynvml, which only
the NVML module imports, lazily, and orjson, which only the wire module imports, and works
without (tests/protocol/test_wire_encoding.py).

Inside the collector, every module but the app's entry (``jobsight.collector.app``) lives in a
room, and a room imports only itself and the rooms below it, in the order of
:data:`COLLECTOR_ROOMS` (``config`` at the bottom, ``api`` at the top). The entry may import any
room; no room imports the entry. The agent's rooms keep the same rule, in the order of
:data:`AGENT_ROOMS`, and so do the node daemon's, in the order of :data:`NODE_ROOMS`: the job
registrations and Slurm's cgroup paths at the bottom, the GPU, node power and Kineto rooms side by
side above them (rooms side by side import nothing of one another), and the daemon's own modules
that put them together (attribution, host, daemon) on top. A module is held to every order it
stands in (``jobsight.agent.node.gpu.sampler`` to the agent's and the node's).

No module imports itself back through others: :func:`import_cycles` finds every cycle in the
graph of these imports (``TYPE_CHECKING`` imports and imports inside functions included).
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
    # The server's rules (health, hardware causes, report and energy text, job states, links): the
    # collector, the dashboard and the CLI judge and word with them; the agent never ships them.
    ("jobsight.rules", ("jobsight.protocol", "jobsight.rules")),
    ("jobsight.agent", ("jobsight.protocol", "jobsight.agent")),
    ("jobsight.collector", ("jobsight.protocol", "jobsight.rules", "jobsight.collector")),
    # The dashboard reads through the collector's query room (and opens its pool, reads its settings
    # base); the migrations know the store's schema.
    ("jobsight.dashboard", ("jobsight.protocol", "jobsight.rules", "jobsight.collector.query",
                            "jobsight.collector.store", "jobsight.collector.config", "jobsight.dashboard")),
    ("jobsight.migrations", ("jobsight.protocol", "jobsight.collector.store", "jobsight.migrations")),
    ("jobsight.commands", ("jobsight",)),
    ("jobsight.cli", ("jobsight",)),
    ("jobsight.__main__", ("jobsight.cli",)),
    ("jobsight", ()),
]
STDLIB_ONLY = ("jobsight.protocol", "jobsight.agent.shipping", "jobsight.agent.node", "jobsight.agent.slurm",

               "jobsight.agent.settings", "jobsight.agent.atomic_files")
ORJSON_HOME = "jobsight.protocol.wire"  # optional: a faster batch encoder, when the agent extra brought it
PYNVML_HOME = "jobsight.agent.node.gpu.nvml"
COLLECTOR_ROOMS = ("config", "store", "tiers", "jobs", "ingest", "query", "passes", "api")
"""The collector's rooms, bottom first: each may import itself and the rooms before it."""
COLLECTOR_ENTRY = "jobsight.collector.app"
AGENT_ROOMS = ("settings", "atomic_files", "traces", "shipping", "node", "slurm", "training")
"""The agent's rooms (folders, and the two modules every room shares), bottom first."""
NODE_ROOMS: tuple[str | tuple[str, ...], ...] = (
    "registrations", "slurm_cgroups", ("gpu", "power", "kineto"), "attribution", "host", "daemon")
"""The node daemon's rooms (folders, and the core's modules), bottom first; a tuple holds rooms side
by side: the GPU (NVML), the node's power and the Kineto service each work without the others, and
only the daemon's core (and the command that starts it) puts them together, so a change in one
cannot break another on a node."""
ROOM_ORDERS: dict[str, tuple[str | tuple[str, ...], ...]] = {
    "jobsight.collector": COLLECTOR_ROOMS, "jobsight.agent": AGENT_ROOMS, "jobsight.agent.node": NODE_ROOMS}
ROOM_ENTRIES = {"jobsight.collector": (COLLECTOR_ENTRY,), "jobsight.agent": (), "jobsight.agent.node": ()}
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


def _room(module: str, package: str) -> str | None:
    """The room of ``module`` in ``package`` (its first name below it); ``None`` for the package itself."""
    rest = module[len(package) + 1:] if module.startswith(package + ".") else ""
    return rest.split(".")[0] or None


def _level(order: tuple[str | tuple[str, ...], ...], room: str | None) -> int | None:
    """The place of ``room`` in ``order`` (rooms side by side share one); ``None`` outside it."""
    for level, entry in enumerate(order):
        if room == entry or (isinstance(entry, tuple) and room in entry):
            return level
    return None


def _listed(order: tuple[str | tuple[str, ...], ...], joint: str) -> str:
    return joint.join(entry if isinstance(entry, str) else "{" + ", ".join(entry) + "}" for entry in order)


def room_problems(module: str, where: Path, imports: list[Import], known: set[str]) -> list[str]:
    """The imports of ``module`` that point up (or sideways out of its package's room order), and
    ``module`` itself when it stands outside every room; for each package whose rooms hold it."""
    problems: list[str] = []
    for package, order in ROOM_ORDERS.items():
        if not _within(module, package) or module == package:
            continue
        entries = ROOM_ENTRIES[package]
        room = _room(module, package)
        if module in entries:
            continue
        level = _level(order, room)
        if level is None:
            problems.append(f"{where}:1: {module} is outside the rooms of {package} ({_listed(order, ', ')})")
            continue
        for item in imports:
            target = _project_target(item.target, known)
            if target is None or not _within(target, package) or target == package:
                continue
            if target in entries:
                problems.append(f"{where}:{item.line}: {module} ({room}) may not import the entry {target}")
                continue
            other = _room(target, package)
            other_level = _level(order, other)
            if other_level is None or other == room or other_level < level:
                continue
            why = "a room imports only rooms below it" if other_level > level else \
                "rooms side by side import nothing of one another"
            problems.append(f"{where}:{item.line}: {module} ({room}) may not import {target} ({other}): "
                            f"{why} ({_listed(order, ' < ')})")
    return problems


def import_graph(repo: Path) -> dict[str, set[str]]:
    """Every project module -> the project modules it imports (by statement, at any depth)."""
    files = module_files(repo)
    known = set(files)
    graph: dict[str, set[str]] = {module: set() for module in files}
    for module, path in files.items():
        for item in imports_of(module, path, known):
            target = _project_target(item.target, known)
            # A submodule naming its own package (a logger called "jobsight.collector") is no cycle.
            if target in known and target != module and not module.startswith(f"{target}."):
                graph[module].add(target)
    return graph


def import_cycles(repo: Path) -> list[list[str]]:
    """Every group of modules that import each other, round and round (Tarjan's strongly connected
    components of more than one module, or a module importing itself), each sorted."""
    graph = import_graph(repo)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so a deep chain of imports cannot hit the recursion limit.
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            step = next(targets, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    cycles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(cycles)


def violations(repo: Path) -> list[str]:
    """Every import that breaks the rule, as ``path:line: message``."""
    files = module_files(repo)
    known = set(files)
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    problems: list[str] = []
    for module, path in files.items():
        where = path.relative_to(repo)
        allowed = next(targets for prefix, targets in ALLOWED if _within(module, prefix))
        imports = list(imports_of(module, path, known))
        problems.extend(room_problems(module, where, imports, known))
        for item in imports:
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
