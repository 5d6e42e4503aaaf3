"""Which line of the user's code issued an op, from the Python frames the torch profiler
records with ``with_stack=True`` (its Python tracer: one event per Python call, the ops nested
under them).

The source of an op is the innermost frame of the user's code above it, reached through
torch, the standard library and other libraries only; an op reached through a training
framework (Lightning, Keras, jobsight) is the framework's own work (Keras moving its variables
each step, Lightning calling backward), not a line the user wrote, and has no source.

The tracer names a frame ``path(line): function``, where ``path`` is relative to the
``sys.path`` entry it was found under (``torch.profiler.python_tracer._prefix_regex``) and
``line`` is the function's first line for a frame entered while tracing, or the line a frame
was on when the tracer started: never the line of each call. That line is read from the user's
source with :mod:`ast`: in the frame's function, the call of the function it called (or the
operator that issues the op), preferring one inside a loop. Standard library only; it runs in
the training process, where the user's files are.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import site
import sys
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

FRAMEWORKS: Final = frozenset({"lightning", "pytorch_lightning", "lightning_fabric", "keras", "tf_keras", "jobsight"})
"""Top-level packages that call the user's code: an op reached through them is theirs."""

_FRAME = re.compile(r"^(?P<path>.+)\((?P<line>\d+)\): (?P<function>.+)$")
_BUILTIN = re.compile(r"^<built-in (?:function|method) (?P<function>[^ >]+)")
_WRAPPERS: Final = frozenset({"_wrapped_call_impl", "_call_impl", "__call__", "decorate_context", "wrapper", "_fn"})
# Ops a Python operator or subscript issues with no Python call in between, and the syntax
# that issues them, so their line is found too.
_OPERATORS: Final[dict[str, tuple[type[ast.AST], ...]]] = {
    "add": (ast.Add,), "add_": (ast.Add,), "sub": (ast.Sub,), "rsub": (ast.Sub,), "sub_": (ast.Sub,),
    "mul": (ast.Mult,), "mul_": (ast.Mult,), "div": (ast.Div,), "div_": (ast.Div,), "matmul": (ast.MatMult,),
    "select": (ast.Subscript,), "slice": (ast.Subscript,), "index": (ast.Subscript,),
}
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


@dataclass(frozen=True)
class Source:
    """One line of the user's code and the function it calls there."""

    file: str
    """The file's base name."""
    line: int
    function: str
    """The user's function that holds the line."""
    calls: str
    """The function called on that line (``cross_entropy``), or the op's name for an operator."""
    exact: bool
    """``False``: the call was not found in the source, and ``line`` is the frame's own (the
    function's first line, or the line it was on when the tracer started)."""
    loop_line: int | None
    """The line of the innermost loop around the call, ``None`` when it is in none (or not exact)."""
    operator: bool = False
    """``True``: no Python call issued the op; ``calls`` is the op an operator or subscript issues."""

    def as_dict(self, calls_per_step: float) -> dict[str, Any]:
        return {
            "file": self.file[:200], "line": self.line, "function": self.function[:200], "calls": self.calls[:200],
            "exact": self.exact, "loop_line": self.loop_line, "operator": self.operator,
            "calls_per_step": calls_per_step,
        }


@dataclass(frozen=True)
class _Frame:
    path: str
    line: int
    function: str


def _parse_frame(name: str) -> _Frame | None:
    match = _FRAME.match(name)
    if match is None:
        return None
    return _Frame(match["path"], int(match["line"]), match["function"])


def _called_name(name: str) -> str:
    """What a frame's event calls, as the user wrote it: ``cross_entropy`` for both
    ``torch/nn/functional.py(3472): cross_entropy`` and ``<built-in function cross_entropy>``."""
    frame = _parse_frame(name)
    if frame is not None:
        return frame.function
    builtin = _BUILTIN.match(name)
    return builtin["function"] if builtin else name[:80]


class SourceFinder:
    """Finds the user's source of each op event; one per profile window (it caches per frame).

    ``prefixes`` are the directories the tracer strips from paths (torch's own list by
    default); ``library_roots`` those whose files are not the user's (site-packages and the
    standard library by default)."""

    def __init__(self, prefixes: Sequence[str] | None = None, library_roots: Iterable[str] | None = None) -> None:
        self.prefixes = list(prefixes) if prefixes is not None else _tracer_prefixes()
        roots = library_roots if library_roots is not None else _library_roots()
        self.library_roots = tuple(os.path.join(os.path.abspath(root), "") for root in roots)
        self._kinds: dict[str, tuple[str, str | None]] = {}
        self._walks: dict[int, tuple[Any, Any, Any] | None] = {}

    def source(self, event: Any) -> tuple[Source, int] | None:
        """The user's line that issued ``event`` (a ``FunctionEvent`` of an op) and a key of the
        call on that line it ran under (ops of one call share it); ``None`` when no line of the
        user's did."""
        outermost, parent = event, event.cpu_parent
        while parent is not None and not parent.is_python_function:
            outermost, parent = parent, parent.cpu_parent
        if parent is None:
            return None
        key = id(parent)
        if key not in self._walks:
            self._walks[key] = self._walk(parent)
        found = self._walks[key]
        if found is None:
            return None
        user, named, call = found
        frame = _parse_frame(user.name)
        path = self._kind(frame.path)[1] if frame is not None else None
        if frame is None or path is None:
            return None
        if named is not None:
            return _locate(path, frame, _called_name(named.name), from_op=False), id(call)
        # No Python call in between: the op an operator or subscript issued (aten::select for
        # ``x[:, t]``, not the aten::as_strided inside it).
        return _locate(path, frame, str(outermost.name).removeprefix("aten::"), from_op=True), id(outermost)

    def _walk(self, frame_event: Any) -> tuple[Any, Any, Any] | None:
        """From the innermost Python frame outwards: the first user frame, the function it called
        as named (wrappers such as ``Module._call_impl`` passed over) and the call's own frame."""
        inner: list[Any] = []
        node = frame_event
        while node is not None:
            if node.is_python_function:
                frame = _parse_frame(node.name)
                kind = self._kind(frame.path)[0] if frame is not None else "library"
                if kind == "user":
                    if not inner:
                        return node, None, None
                    named = next((f for f in reversed(inner) if _called_name(f.name) not in _WRAPPERS), inner[-1])
                    return node, named, inner[-1]
                if kind == "framework":
                    return None
                inner.append(node)
            node = node.cpu_parent
        return None

    def _kind(self, path: str) -> tuple[str, str | None]:
        """``("user" | "library" | "framework", the file's absolute path or None)``."""
        known = self._kinds.get(path)
        if known is None:
            known = self._kinds[path] = self._classify(path)
        return known

    def _classify(self, path: str) -> tuple[str, str | None]:
        if path.startswith("<"):
            return "library", None  # <frozen posixpath>, <string>
        top = path.replace(os.sep, "/").split("/", 1)[0].removesuffix(".py")
        if top in FRAMEWORKS:
            return "framework", None
        found = next((p + path for p in self.prefixes if os.path.isfile(p + path)), None)
        if found is None and os.path.isabs(path) and os.path.isfile(path):
            found = path
        if found is None:
            return "library", None
        found = os.path.abspath(found)
        if top == "torch" or any(found.startswith(root) for root in self.library_roots):
            return "library", found
        return "user", found


def _tracer_prefixes() -> list[str]:
    try:
        from torch.profiler.python_tracer import _prefix_regex

        return list(_prefix_regex())
    except Exception:  # noqa: BLE001 - boundary: a torch without it; the same list, built here
        paths = site.getsitepackages() + sys.path + [site.getuserbase(), site.getusersitepackages()]
        return [p + os.sep for p in sorted({os.path.abspath(p) for p in paths}, reverse=True)]


def _library_roots() -> list[str]:
    names = ("stdlib", "platstdlib", "purelib", "platlib")
    roots = {sysconfig.get_paths()[n] for n in names} | set(site.getsitepackages()) | {site.getusersitepackages()}
    return sorted(roots)


@functools.lru_cache(maxsize=4096)
def _locate(path: str, frame: _Frame, calls: str, *, from_op: bool) -> Source:
    file = os.path.basename(path)
    sites = _call_sites(path, frame.line, frame.function)
    wanted = sites.get(("op", calls) if from_op else ("call", calls), []) if sites else []
    if not wanted:
        return Source(file, frame.line, frame.function, calls, False, None, from_op)
    line, loop_line = min(wanted, key=lambda site: (site[1] is None, site[0]))
    return Source(file, line, frame.function, calls, True, loop_line, from_op)


CallSites = dict[tuple[str, str], list[tuple[int, int | None]]]


@functools.lru_cache(maxsize=256)
def _call_sites(path: str, line: int, function: str) -> CallSites | None:
    """In ``function`` of ``path`` (``<module>``: the module's own code), the one that starts at
    ``line`` (a frame entered while tracing) or holds it (a frame that was running when the
    tracer started, on that line): its calls by called name, and its operators by the op they
    issue, each with ``(line, innermost loop's line or None)``. ``None`` when there is no such
    function or the file cannot be read."""
    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read(), path)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    body: ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | None = tree if function == "<module>" else None
    if body is None:
        holding = [
            node for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function
            and min([node.lineno] + [d.lineno for d in node.decorator_list]) <= line <= (node.end_lineno or line)
        ]
        body = max(holding, key=lambda node: node.lineno, default=None)  # the innermost
    if body is None:
        return None
    sites: CallSites = {}

    def visit(node: ast.AST, loop: int | None) -> None:
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name is not None:
                sites.setdefault(("call", name), []).append((node.lineno, loop))
        syntax = node.op if isinstance(node, (ast.BinOp, ast.AugAssign)) else node
        for op, kinds in _OPERATORS.items():
            if isinstance(syntax, kinds) and isinstance(node, (ast.expr, ast.stmt)):
                sites.setdefault(("op", op), []).append((node.lineno, loop))
        if isinstance(node, _LOOPS):
            # The iterable (or condition) is evaluated before the loop; the body runs in it.
            visit(node.test if isinstance(node, ast.While) else node.iter, loop)
            for part in (*node.body, *node.orelse):
                visit(part, node.lineno)
            return
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, _SCOPES):  # a nested definition's calls are its own frame's
                visit(child, loop)

    for statement in body.body:
        if not isinstance(statement, _SCOPES):
            visit(statement, None)
    return sites
