"""The core's import graph flows one way: no cycle (module level or inside functions), no
import of ``ctensor.nn`` / ``ctensor.optim``, and MPI or NCCL only inside ``ctensor/comm/``.

The graph is read from the source with ``ast`` (every ``import``, wherever it stands, except
under ``if TYPE_CHECKING:``); a relative import of a package's name counts as an import of
that module. The package ``ctensor/__init__.py`` (the public facade) is left out as a
target: importing a submodule loads it first, which is not a dependency of the submodule.
"""
from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "ctensor"
COMM = CORE / "comm"
COMMUNICATION_MODULES = ("mpi4py", "cupy.cuda.nccl")


def _module_name(path: Path) -> str:
    rel = path.relative_to(CORE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import/ImportFrom node, outside ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _graph():
    modules = {_module_name(p): p for p in CORE.rglob("*.py")}
    edges, external = {m: set() for m in modules}, {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
                targets = [module] + [f"{module}.{a.name}" for a in node.names]
            for target in targets:
                if target in modules and target != "ctensor" and target != name:
                    edges[name].add(target)
                elif not target.startswith("ctensor"):
                    external[name].add(target)
                elif target.startswith(("ctensor.nn", "ctensor.optim")):
                    external[name].add(target)
    return edges, external, modules


def _cycle(edges: dict):
    """One import cycle as a list of modules, or None."""
    state, path = {}, []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == "open":
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        state[m] = "done"
        path.pop()
        return None

    for m in sorted(edges):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_core_imports_have_no_cycle():
    edges, _, _ = _graph()
    cycle = _cycle(edges)
    assert cycle is None, "import cycle in the core: " + " -> ".join(cycle)


def test_core_never_imports_nn_or_optim():
    _, external, _ = _graph()
    bad = {m: sorted(t for t in ts if t.startswith(("ctensor.nn", "ctensor.optim")))
           for m, ts in external.items()}
    assert not {m: t for m, t in bad.items() if t}


def test_mpi_and_nccl_only_inside_comm():
    _, external, modules = _graph()
    outside = {}
    for m, targets in external.items():
        if modules[m].is_relative_to(COMM):
            continue
        hits = sorted(t for t in targets if t.startswith(COMMUNICATION_MODULES))
        if hits:
            outside[m] = hits
    assert not outside, f"MPI/NCCL imported outside ctensor/comm/: {outside}"


def test_the_checker_finds_a_cycle():
    # the test above could not fail if the cycle finder never found one
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
