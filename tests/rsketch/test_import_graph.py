"""rsketch reads top-down: no import cycle, and every import goes down the layers.

Layers, bottom first: the shared helpers (``_validation``, ``_backend``, ``_parallel``, ``_progress``,
``_random``, ``_exact_scaling``),
``kernels``, ``operators``, ``linalg``, ``stats``, ``estimators``, the public API (``rsketch/__init__.py``),
then the programs (``experiments``, ``demo``).
Imports inside functions count too: hiding one there hides a cycle, it does not remove it.
"""

import ast
import pathlib
import subprocess
import sys

import rsketch

ROOT = pathlib.Path(rsketch.__file__).parent
LAYERS = {
    "rsketch._validation": 0,
    "rsketch._backend": 0,
    "rsketch._parallel": 0,  # the lock of parallel launches under numba's workqueue layer
    "rsketch._progress": 0,  # progress bars that cost nothing when off
    "rsketch._random": 1,
    "rsketch._exact_scaling": 1,  # power-of-two scaling into the safe range: operators and solvers
    "rsketch.kernels": 2,
    "rsketch.operators": 3,
    "rsketch.dask._sketch": 3,  # lazy S @ A, called by SketchOperator.__matmul__
    "rsketch.linalg": 4,
    "rsketch.dask": 4,  # the rest of the Dask room: inputs, leverage scores, the solvers' passes over chunks
    "rsketch.stats": 5,
    "rsketch.estimators": 6,
    "rsketch": 7,  # the package's __init__: the public API, over the library's layers
    "rsketch.experiments": 8,
    "rsketch.demo": 9,
}


def module_name(path: pathlib.Path) -> str:
    parts = ("rsketch",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: pathlib.Path) -> set[str]:
    """Every rsketch module that ``path`` imports, at any depth of its code."""
    found = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + [base]).strip(".")
            found.add(base)
    return {name for name in found if name == "rsketch" or name.startswith("rsketch.")}


def layer(name: str) -> int:
    best = max((prefix for prefix in LAYERS if name == prefix or name.startswith(prefix + ".")), key=len)
    return LAYERS[best]


GRAPH = {module_name(p): imports(p) for p in ROOT.rglob("*.py")}


def test_imports_go_down_the_layers():
    upward = [
        (mod, dep)
        for mod, deps in GRAPH.items()
        for dep in deps
        if layer(dep) > layer(mod) and not dep.startswith(mod + ".")
    ]
    assert upward == []


def test_no_import_cycle():
    state = {}

    def visit(mod, stack):
        state[mod] = "open"
        for dep in GRAPH.get(mod, ()):
            if dep not in GRAPH or dep == mod:
                continue
            if state.get(dep) == "open":
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(dep) :] + [dep]))
            if dep not in state:
                visit(dep, stack + [dep])
        state[mod] = "done"

    for mod in GRAPH:
        if mod not in state:
            visit(mod, [mod])


def test_import_rsketch_alone_changes_nothing():
    # ConvergenceWarning subclassed scikit-learn's at import: `import rsketch` imported scikit-learn
    # (a second) and so set KMP_DUPLICATE_LIB_OK and KMP_INIT_AT_FORK in the environment; the class
    # is made on first use now, and is the one the solvers warn with
    code = (
        "import os, sys; before = dict(os.environ); import rsketch; "
        "assert 'sklearn' not in sys.modules, 'sklearn imported'; "
        "assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items()); "
        "import sklearn.exceptions, rsketch.linalg._results as r; W = rsketch.ConvergenceWarning; "
        "assert issubclass(W, sklearn.exceptions.ConvergenceWarning); "
        "assert W is rsketch.linalg.ConvergenceWarning is r.ConvergenceWarning; "
        "print('ok')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
