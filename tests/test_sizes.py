"""Rooms a reader can hold: no class over MAX_CLASS_LINES and no function over MAX_FUNCTION_LINES in
hermes/ and ui/, measured with `ast` (decorators, docstrings and comments included). The largest
of each are printed (pytest -s shows them), so that the margin is in sight before a limit is."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hermes", "ui")
MAX_CLASS_LINES = 260
MAX_FUNCTION_LINES = 70
SHOWN = 5


def sizes(source: str, name: str) -> list[tuple[int, str, str]]:
    """(lines, kind, where) of every class and function (methods and nested ones included) of the
    module `source`, named `name` in `where`."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            out.append((node.end_lineno - first + 1, kind, f"{name}:{node.lineno} {node.name}"))
    return out


def all_sizes() -> list[tuple[int, str, str]]:
    files = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
    return sorted((s for f in files for s in sizes(f.read_text(), str(f.relative_to(ROOT)))), reverse=True)


def test_the_measure_counts_every_line_of_a_definition():
    source = "@dataclass\nclass A:\n    x: int = 1\n\n    def f(self):\n        '''doc'''\n        return 1\n"
    assert sorted(sizes(source, "m.py")) == [(3, "function", "m.py:5 f"), (7, "class", "m.py:2 A")]


@pytest.mark.parametrize(
    ("kind", "plural", "limit"), [("class", "classes", MAX_CLASS_LINES), ("function", "functions", MAX_FUNCTION_LINES)]
)
def test_no_class_or_function_is_too_long_to_hold(kind, plural, limit):
    found = [s for s in all_sizes() if s[1] == kind]
    assert found, f"no {kind} found under {', '.join(PACKAGES)}"
    print(f"\nlargest {plural} (limit {limit} lines):")
    for lines, _, where in found[:SHOWN]:
        print(f"  {lines:4d}  {where}")
    over = [f"{where} ({lines} lines)" for lines, _, where in found if lines > limit]
    assert not over, f"over {limit} lines: {', '.join(over)}"
