"""The decoding package reads top-down: no import cycle between its modules, none hidden in a function.

The graph is built with ``ast`` from every import of every ``decoding/*.py`` file, at any depth
(module level, inside functions and classes), so an import moved into a function to dodge a cycle
still counts.
"""

import ast
from pathlib import Path

import decoding

PACKAGE = Path(decoding.__file__).parent
MODULES = {p.stem: p for p in PACKAGE.glob("*.py")}


def _targets(node: ast.AST) -> list[str]:
    """The decoding modules an import statement names ("__init__" for the package itself)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level == 0:
            names = [node.module] if node.module else []
        elif node.level == 1:
            base = f"decoding.{node.module}" if node.module else "decoding"
            names = [base] if node.module else [f"decoding.{a.name}" for a in node.names]
        else:
            return []
    else:
        return []
    out = []
    for n in names:
        parts = n.split(".")
        if parts[0] != "decoding":
            continue
        sub = parts[1] if len(parts) > 1 else "__init__"
        out.append(sub if sub in MODULES else "__init__")
    return out


def _imports(path: Path) -> dict[str, list[int]]:
    """``{module: [line numbers]}`` of the decoding modules imported anywhere in ``path``."""
    out: dict[str, list[int]] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        for t in _targets(node):
            out.setdefault(t, []).append(node.lineno)
    return out


def _graph() -> dict[str, set[str]]:
    return {m: set(_imports(p)) - {m} for m, p in MODULES.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (as a path that ends where it starts), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m):
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n) :] + [n]
            if n not in state and (c := visit(n)):
                return c
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m)):
            return c
    return None


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle():
    assert _cycle(_graph()) is None


def test_package_imports_are_at_module_level():
    """Imports of decoding's own modules sit at the top of each file, never inside a function."""
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if _targets(node) and id(node) not in top:
                raise AssertionError(
                    f"decoding/{name}.py:{node.lineno} imports {_targets(node)} in a function"
                )


def test_the_package_reads_top_down():
    """File reading, then the model, then its cache users, the loops and the entry point."""
    g = _graph()

    def below(m):  # everything m imports, directly or not
        seen, todo = set(), [m]
        while todo:
            for n in g[todo.pop()] - seen:
                seen.add(n)
                todo.append(n)
        return seen

    assert {"model", "kv_cache", "gguf_reader", "config"} <= below("loading")
    assert {"scheduling", "drafters", "model"} <= below("speculative")
    assert "api" not in below("speculative") | below("drafters") | below("loading")
    for m in ("gguf_reader", "config", "tokenizer", "model", "kv_cache"):
        assert not below(m) & {"autoregressive", "speculative", "scheduling", "drafters", "api", "loading"}
