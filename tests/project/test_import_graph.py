"""The package's modules import each other without a cycle (issue 49): each module's imports of the package, read
with ``ast`` (those inside functions included: a lazy import only hides a cycle), form a graph with none."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "include" / "image_tfrecords"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package modules ``path`` imports (``from .x import y``: ``x.y`` where that is a module, else ``x``)."""
    name = _module(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(PACKAGE.name)):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            target = (f"{base}.{node.module}" if node.module else base) if node.level else str(node.module)
            for alias in node.names:
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
    return {module for module in found if module in modules and module != name}


def _graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module(path) for path in paths}
    return {_module(path): _imports(path, modules) for path in paths}


def test_the_graph_is_read() -> None:
    graph = _graph()
    assert "image_tfrecords.shards.checks" in graph["image_tfrecords.shards.splice"]
    assert "image_tfrecords.storage.multipart" in graph["image_tfrecords.shards.splice"]


def test_the_modules_import_each_other_without_a_cycle() -> None:
    """Every edge counts, a package's ``__init__`` and its modules included (on the code before issue 49:
    shards.prepare -> shards.proofs -> shards.prepare)."""
    try:
        TopologicalSorter(_graph()).prepare()
    except CycleError as exc:
        raise AssertionError(f"an import cycle: {' -> '.join(exc.args[1])}") from None
