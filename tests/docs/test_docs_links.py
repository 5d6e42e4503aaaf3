"""The doors into the project lead somewhere: README.md stays a short front door, and every relative link,
every repository path written in backticks and every house-rule citation points at something the
repository holds.

What is checked, in README.md, CONTRIBUTING.md and every ``docs/**/*.md`` (fenced code blocks left out):

* a relative link ``[text](path)`` or ``[text](path#anchor)`` (images too) names a file or folder that
  exists, inside the repository; an anchor into a markdown file (or ``#anchor`` into the same file)
  names one of its headings, slugged as GitHub does;
* a repository path in backticks exists. A backticked token is taken for a path when it has a ``/``,
  holds only letters, digits, ``_ . - /`` (so ``<job>/``, ``kineto_*`` and ``{a, b}`` are not paths),
  starts with a top-level folder of the repository (``collector/``, ``tests/``, ``bench/``…) and ends in
  ``/`` or a file extension in :data:`PATH_ENDINGS`; a pytest node id's ``::name`` and a ``:line``
  suffix are cut off first (``tests/rules/test_health_rules.py::test_x`` is checked as the file);
* a module written as its import path in backticks (``jobsight.agent.node.gpu.nvml``, or a name in one:
  ``jobsight.protocol.terminal_text.terminal_safe``) is a module of the package, and the name after
  the module is defined in it;
* nothing points outside the project to the shared working folder, which users do not have.

And in every text file of the repository (code, tests, docs, scripts, CI): a house rule is cited as
"CONTRIBUTING rule N", with N a rule CONTRIBUTING.md numbers; the old citation form is gone.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README_MAX_LINES = 200

PATH_ENDINGS = (
    "/", ".py", ".md", ".sh", ".c", ".h", ".toml", ".ini", ".in", ".cfg", ".json", ".yaml", ".yml", ".txt",
    ".png", ".service", ".example", ".mako",
)
"""What a backticked repository path ends in (a folder, or a file of a kind the repository keeps)."""

SKIPPED_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis",
                "build", "dist", "test-output"}
"""Folders no citation scan enters: version control, the virtualenv, caches and build outputs."""

OLD_CITATION = "STYLE" + " rule"  # spelled in two pieces so this file does not cite it itself
SHARED_FOLDER = ("../shared", "/work/" + "shared")
CITATION = re.compile(r"CONTRIBUTING rules? (\d+(?:\s*(?:,|and|-|–)\s*\d+)*)")
RULE_HEADING = re.compile(r"^#{2,4}\s+Rule (\d+)\b")

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^()\s<>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")
PATH_TOKEN = re.compile(r"^[\w.\-/]+$")
MODULE_TOKEN = re.compile(r"^jobsight(?:\.\w+)+$")


def documents() -> list[Path]:
    """The documents whose links and paths are checked: the two doors and everything under docs/."""
    found = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").rglob("*.md"))]
    return [path for path in found if path.is_file()]


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """Each line outside fenced code blocks, with its number (code in a fence is an example, not a link)."""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: link text kept, lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a markdown file offers: its headings' slugs (GitHub's -1, -2 for repeats) and HTML ids."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        found.update(HTML_ANCHOR.findall(line))
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def top_level_folders() -> set[str]:
    """The repository's own top-level folders (hidden ones and build outputs aside, but ``.ci``)."""
    return {entry.name for entry in REPO.iterdir()
            if entry.is_dir() and entry.name not in SKIPPED_DIRS and not entry.name.endswith(".egg-info")
            and (not entry.name.startswith(".") or entry.name == ".ci")}


def link_problems(document: Path) -> list[str]:
    """The relative links of ``document`` that lead nowhere, as ``file:line: why``."""
    problems: list[str] = []
    where = document.relative_to(REPO)
    for number, line in prose_lines(document.read_text(encoding="utf-8")):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if SCHEME.match(target):
                continue
            path_part, _, anchor = target.partition("#")
            destination = (document.parent / path_part).resolve() if path_part else document
            if not destination.is_relative_to(REPO):
                problems.append(f"{where}:{number}: {target} leads outside the repository")
            elif not destination.exists():
                problems.append(f"{where}:{number}: {target}: no such file or folder")
            elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
                problems.append(f"{where}:{number}: {target}: no heading with the anchor #{anchor}")
    return problems


def backticked_paths(text: str) -> Iterator[tuple[int, str]]:
    """The backticked tokens of ``text`` that are repository paths by the rule in this module's docstring."""
    folders = top_level_folders()
    for number, line in prose_lines(text):
        for _, token in CODE_SPAN.findall(line):
            token = token.strip().split("::")[0]
            token = re.sub(r":\d+(-\d+)?$", "", token)
            if "/" not in token or not PATH_TOKEN.match(token) or not token.endswith(PATH_ENDINGS):
                continue
            if token.split("/")[0] in folders:
                yield number, token


def path_problems(document: Path) -> list[str]:
    where = document.relative_to(REPO)
    return [f"{where}:{number}: `{token}` is not in the repository"
            for number, token in backticked_paths(document.read_text(encoding="utf-8"))
            if not (REPO / token).exists()]


def module_named(dotted: str) -> bool:
    """Whether ``dotted`` is a module of the package, or a name a module of it defines or imports."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:cut])  # jobsight/agent etc. are links to the top-level folders
        for module in (base.with_suffix(".py"), base / "__init__.py"):
            if module.is_file():
                rest = parts[cut:]
                if not rest:
                    return True
                name = re.escape(rest[0])
                defined = (rf"^\s*(?:async\s+def|def|class)\s+{name}\b|^\s*{name}\s*[:=]"
                           rf"|^\s*(?:from|import)\s.*\b{name}\b")
                return re.search(defined, module.read_text(encoding="utf-8"), re.MULTILINE) is not None
    return False


def module_problems(document: Path) -> list[str]:
    where = document.relative_to(REPO)
    return [f"{where}:{number}: `{token}` is no module of the package, nor a name one defines"
            for number, line in prose_lines(document.read_text(encoding="utf-8"))
            for token in (span.strip() for _, span in CODE_SPAN.findall(line))
            if MODULE_TOKEN.match(token) and not module_named(token)]


def text_files() -> Iterator[Path]:
    """Every text file of the repository a reader or a tool may open: code, tests, scripts, docs, CI."""
    stack = [REPO]
    while stack:
        folder = stack.pop()
        for entry in sorted(folder.iterdir()):
            if entry.is_symlink():
                continue  # jobsight/<part> -> ../<part>: read once, from the real folder
            if entry.is_dir():
                if entry.name not in SKIPPED_DIRS and not entry.name.endswith(".egg-info"):
                    stack.append(entry)
                continue
            try:
                text = entry.read_bytes()
            except OSError:
                continue
            if b"\0" not in text[:8192]:
                yield entry


def contributing_rules() -> list[int]:
    """The house rules CONTRIBUTING.md numbers (its ``### Rule N: ...`` headings), in order."""
    text = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    return [int(match.group(1)) for _, line in prose_lines(text) if (match := RULE_HEADING.match(line))]


def test_readme_is_a_short_front_door() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines: move detail into docs/"


def test_slugs_are_githubs() -> None:
    # The anchors GitHub gives these headings, so that a link checked here also works there.
    assert slug("Real deployment") == "real-deployment"
    assert slug("On Citus (distributed PostgreSQL), by job id") == "on-citus-distributed-postgresql-by-job-id"
    assert slug("Collector (`jobsight.collector.config.settings`; a bad value stops it)") == (
        "collector-jobsightcollectorconfigsettings-a-bad-value-stops-it")
    assert slug("11. Acting on waste: a job cannot") == "11-acting-on-waste-a-job-cannot"


def test_every_relative_link_leads_to_a_file_and_heading() -> None:
    problems = [problem for document in documents() for problem in link_problems(document)]
    assert problems == [], "\n".join(problems)


def test_every_backticked_repository_path_exists() -> None:
    problems = [problem for document in documents() for problem in path_problems(document)]
    assert problems == [], "\n".join(problems)


def test_every_backticked_module_exists() -> None:
    problems = [problem for document in documents() for problem in module_problems(document)]
    assert problems == [], "\n".join(problems)


def test_the_module_rule_finds_modules_and_their_names() -> None:
    assert module_named("jobsight.protocol.wire") and module_named("jobsight.collector.config.settings")
    assert module_named("jobsight.protocol.terminal_text.terminal_safe")
    assert not module_named("jobsight.protocol.no_such_module")
    assert not module_named("jobsight.protocol.wire.no_such_name")


def test_the_path_rule_takes_paths_and_leaves_the_rest() -> None:
    text = ("`collector/passes/findings.py`, `tests/slurm/`, `bench/read_pressure.py:12`, "
            "`tests/rules/test_health_rules.py::test_x`, `<data>/logs/x.log`, `agent/node/kineto_*`, "
            "`/run/jobsight/kineto`, `jobsight.collector.app`, `collector/{app.py, db.py}`, `POST /v1/ingest`")
    assert [token for _, token in backticked_paths(text)] == [
        "collector/passes/findings.py", "tests/slurm/", "bench/read_pressure.py", "tests/rules/test_health_rules.py"]


def test_no_document_points_to_the_shared_working_folder() -> None:
    problems = [f"{document.relative_to(REPO)}:{number}: {line.strip()}"
                for document in documents()
                for number, line in enumerate(document.read_text(encoding="utf-8").splitlines(), start=1)
                if any(folder in line for folder in SHARED_FOLDER)]
    assert problems == [], "\n".join(problems)


def test_contributing_numbers_its_rules_from_one() -> None:
    rules = contributing_rules()
    assert rules == list(range(1, len(rules) + 1)) and len(rules) >= 15, rules


def test_every_rule_citation_names_a_rule_of_contributing() -> None:
    rules = set(contributing_rules())
    problems: list[str] = []
    for path in text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        where = path.relative_to(REPO)
        for number, line in enumerate(text.splitlines(), start=1):
            if OLD_CITATION in line:
                problems.append(f"{where}:{number}: cites a rule file the repository does not hold: {line.strip()}")
            for match in CITATION.finditer(line):
                cited = {int(n) for n in re.findall(r"\d+", match.group(1))}
                if not cited <= rules:
                    problems.append(f"{where}:{number}: cites CONTRIBUTING rule {sorted(cited - rules)}, not written")
    assert problems == [], "\n".join(problems)
