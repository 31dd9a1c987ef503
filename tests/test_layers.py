"""The layers of the code (docs/design.md, "The layers of the code"): a module imports only from its own
layer or the layers below it, the page only from `hermes.serving` (and app.py's `--ray` from
`hermes.cluster`), and no modules import each other in a circle, counting the imports inside
functions and those made for type checking only."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Package prefix -> layer, bottom first; the longest matching prefix decides.
LAYERS = {
    "hermes.memory": 1,
    "hermes.models": 2,
    "hermes.engine": 3,
    "hermes.video": 4,
    "hermes.runtime": 5,
    "hermes.serving": 6,
    "hermes.bench": 7,
    "hermes.eval": 7,
    "hermes.toyworld": 7,
    "hermes.cluster": 8,
    "hermes.cli": 9,
    "hermes.__main__": 9,
    "hermes": 9,  # the package itself: its version and the command line's entry
    "ui": 10,
    "app": 10,
}
PAGE = 10
# Beside hermes.serving, what a page module may import: app.py's `--ray` front end, the cluster's registry.
PAGE_ALSO = {"app": ("hermes.cluster",)}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {
    module_name(p): p
    for p in [*ROOT.joinpath("hermes").rglob("*.py"), *ROOT.joinpath("ui").rglob("*.py"), ROOT / "app.py"]
}


def layer(module: str) -> int:
    prefix = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[prefix]


def imports(module: str) -> Iterator[tuple[str, int]]:
    """The project's modules that `module` imports (by any import statement), with their line."""
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            found = [n for n in names if n in MODULES] or ([node.module] if node.module in MODULES else [])
        elif isinstance(node, ast.Import):
            found = [alias.name for alias in node.names if alias.name in MODULES]
        else:
            continue
        for target in found:
            # A submodule reaching its own package (`from ui import figures`) is not an edge upward.
            if target != module and not module.startswith(target + "."):
                yield target, node.lineno


def test_the_layer_map_covers_every_module():
    assert len(MODULES) > 100
    assert all(layer(m) for m in MODULES)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module: str) -> None:
    up = [f"{target} (line {line})" for target, line in imports(module) if layer(target) > layer(module)]
    assert not up, f"{module} (layer {layer(module)}) imports from above: {up}"
    if layer(module) == PAGE:
        allowed = ("hermes.serving", *PAGE_ALSO.get(module, ()))
        past = [t for t, _ in imports(module) if layer(t) < PAGE and not t.startswith(allowed)]
        assert not past, f"{module} reaches past hermes.serving: {past}"


@pytest.mark.parametrize("package", ["hermes.eval", "hermes.toyworld"])
def test_the_offline_harnesses_stream_through_the_runtime_not_the_web_serving(package: str) -> None:
    """Evaluation and the toy world run a stream as the command line does (`hermes.runtime`), with no
    part of the web app's serving layer."""
    serving = [
        f"{m} -> {t}" for m in MODULES if m.startswith(package) for t, _ in imports(m) if t.startswith("hermes.serving")
    ]
    assert not serving, serving


def test_no_import_circles():
    graph = {m: {t for t, _ in imports(m)} for m in MODULES}
    circles = []
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    circles.append(" -> ".join([*path, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    assert not circles, "\n".join(sorted(circles)[:10])
