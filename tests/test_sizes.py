"""Rooms a reader can hold: no class over MAX_CLASS_LINES and no function over MAX_FUNCTION_LINES in
hermes/ and ui/, measured with `ast` (decorators, docstrings and comments included). The largest
of each are printed (pytest -s shows them), so that the margin is in sight before a limit is.
And no size is met by moving a class's code out of it: no module-level function reads or writes
another class's private members (those a class of the project sets on `self`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hermes", "ui")
MAX_CLASS_LINES = 250
MAX_FUNCTION_LINES = 60
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


def private_members(tree: ast.AST) -> set[str]:
    """The private names (`_x`, not dunders) that the classes of `tree` set on `self`."""
    found = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                for t in ast.walk(target) if target is not None else ():
                    on_self = isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
                    if on_self and t.attr.startswith("_") and not t.attr.startswith("__"):
                        found.add(t.attr)
    return found


def reaches(tree: ast.AST, private: set[str], name: str) -> list[str]:
    """'where: expression' for each use of a member in `private` by a module-level function of `tree`."""
    out = []
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute) and node.attr in private:
                out.append(f"{name}:{node.lineno} {fn.name}: {ast.unparse(node)}")
    return out


def test_the_check_finds_a_function_reaching_into_a_class():
    source = "class A:\n    def __init__(self):\n        self._x = 1\n\ndef f(a):\n    return a._x\n"
    tree = ast.parse(source)
    assert reaches(tree, private_members(tree), "m.py") == ["m.py:6 f: a._x"]


def test_no_module_level_function_touches_another_class_s_private_members():
    files = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
    trees = {str(f.relative_to(ROOT)): ast.parse(f.read_text()) for f in files}
    private = set().union(*(private_members(t) for t in trees.values()))
    found = [r for name, tree in trees.items() for r in reaches(tree, private, name)]
    assert not found, "module-level functions reaching into a class:\n" + "\n".join(found)
