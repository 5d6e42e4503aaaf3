"""The dashboard's pages draw only what they call Streamlit to draw.

``jobsight dashboard`` serves them without Streamlit's "magic" (``jobsight/commands/dashboard.py``),
which draws a page's bare expressions; Streamlit's AppTest, which the page tests use, keeps it on. A bare
expression in a page would then show in the tests and not on the served page (a stray docstring did,
the other way round, when the server had magic on): there is none.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboard"


def _bare_expressions(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        for body in (getattr(node, "body", None), getattr(node, "orelse", None), getattr(node, "finalbody", None)):
            for index, statement in enumerate(body if isinstance(body, list) else []):
                if not isinstance(statement, ast.Expr) or isinstance(statement.value, (ast.Call, ast.Await)):
                    continue
                documents = isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                if index == 0 and documents and isinstance(statement.value, ast.Constant):
                    continue  # a docstring, which magic leaves alone too
                found.append(f"line {statement.lineno}: {ast.unparse(statement)[:60]}")
    return found


def test_no_page_has_a_bare_expression() -> None:
    # The scripts Streamlit runs (magic rewrites those only, not the modules they import): the app and
    # the pages it registers.
    app = (DASHBOARD / "app.py").read_text()
    pages = [DASHBOARD / "app.py", *(DASHBOARD / "views" / name for name in re.findall(r'PAGES / "(\w+\.py)"', app))]
    assert len(pages) == 7, pages
    found = {page.name: bare for page in pages if (bare := _bare_expressions(page.read_text()))}
    assert not found, found


def test_a_bare_expression_is_found() -> None:
    assert _bare_expressions('"""Doc."""\nimport streamlit as st\nst.title("x")\n"drawn by magic"\n') == [
        "line 4: 'drawn by magic'"]
