"""The job page's header facts (user, partition, nodes, GPUs, elapsed, GPU-hours, state), one Markdown
table (jobsight.dashboard.views.job._facts_table), read as a test reads a page: from an AppTest's
Markdown, or from the table a browser drew."""

from __future__ import annotations

import re
from typing import Any

FIRST_LABEL = "User"
_CELL_EDGE = re.compile(r"(?<!\\)\|")
_ESCAPE = re.compile(r"\\(.)")

BROWSER_FACTS = f"""
const table = [...document.querySelectorAll('[data-testid="stMarkdown"] table')]
    .find(t => (t.querySelector('th') || {{}}).innerText?.trim() === '{FIRST_LABEL}');
if (!table) return null;
const labels = [...table.querySelectorAll('th')].map(e => e.innerText.trim());
const values = [...table.querySelectorAll('td')].map(e => e.innerText.trim());
return Object.fromEntries(labels.map((label, i) => [label, values[i]]));
"""
"""JavaScript for a WebDriver's ``execute_script``: the drawn table as ``{label: value}``, ``null``
before it is drawn."""


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in _CELL_EDGE.split(line.strip())[1:-1]]


def header_facts(at: Any, *, source: bool = False) -> dict[str, str]:
    """``{label: value}`` of the facts table on an AppTest's page, each value as the page shows it (its
    Markdown escapes undone), or with ``source`` as the Markdown says it."""
    for element in at.markdown:
        lines = str(element.value).split("\n")
        if len(lines) == 3 and _cells(lines[0])[:1] == [FIRST_LABEL]:
            labels, values = _cells(lines[0]), _cells(lines[2])
            assert len(labels) == len(values), lines
            return dict(zip(labels, values if source else [_ESCAPE.sub(r"\1", v) for v in values], strict=True))
    raise AssertionError("the page has no header facts table")
