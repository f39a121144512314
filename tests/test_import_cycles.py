"""No module under src/trtmc imports itself back, directly or through others.

Every `import` counts, including those inside functions (a deferred import only hides a cycle until
that function runs); imports under `if TYPE_CHECKING:` do not run and do not count.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "trtmc"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST):
    """Import statements that run, anywhere in the module, skipping `if TYPE_CHECKING:` bodies."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from (n for child in node.orelse for n in _runtime_imports_of(child))
            continue
        yield from _runtime_imports_of(node)


def _runtime_imports_of(node: ast.AST):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    else:
        yield from _runtime_imports(node)


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The trtmc modules that `name` imports."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in _runtime_imports(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # `from pkg import sub` imports the module pkg.sub when there is one, else a name of pkg.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        found |= {t for t in targets if t in modules and t != name}
    return found


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path that returns to its start) per strongly connected group of modules."""
    cycles, state = [], {}

    def visit(module: str, stack: list[str]) -> None:
        state[module] = "open"
        stack.append(module)
        for other in sorted(graph[module]):
            if state.get(other) == "open":
                cycles.append(stack[stack.index(other):] + [other])
            elif other not in state:
                visit(other, stack)
        stack.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    return cycles


def test_the_import_walk_counts_deferred_imports_and_skips_type_checking_ones(tmp_path):
    (tmp_path / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import b\n"
        "from .sub import c\n"
        "if TYPE_CHECKING:\n    from . import d\n"
        "def later():\n    from .e import name\n"
    )
    modules = {m: tmp_path / "x.py" for m in ("pkg", "pkg.a", "pkg.b", "pkg.sub", "pkg.sub.c", "pkg.d", "pkg.e")}
    assert imports_of("pkg.a", tmp_path / "a.py", modules) == {"pkg.b", "pkg.sub.c", "pkg.e"}


def test_the_import_walk_sees_the_clis_imports():
    modules = all_modules()
    cli = imports_of("trtmc.cli", modules["trtmc.cli"], modules)
    assert {"trtmc.bench.cli", "trtmc.cli.build", "trtmc.cli.classify", "trtmc.cli.inspect"} <= cli
    classify = imports_of("trtmc.cli.classify", modules["trtmc.cli.classify"], modules)
    assert {"trtmc.progress", "trtmc.runtime", "trtmc.pipeline", "trtmc.backends"} <= classify


def test_cycle_finder_reports_a_two_module_cycle_and_ignores_a_diamond():
    assert find_cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]
    assert find_cycles({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}) == []


def test_no_module_under_src_trtmc_is_part_of_an_import_cycle():
    modules = all_modules()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    cycles = find_cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)
