"""Every docstring example of every rsketch module runs and gives what it shows.

Modules are discovered, not listed, so a new module's examples run from the day it lands.
"""

import doctest
import importlib
import pkgutil

import numpy as np
import pytest

import rsketch

MODULES = sorted(["rsketch"] + [m.name for m in pkgutil.walk_packages(rsketch.__path__, prefix="rsketch.")])


def test_discovery_finds_the_packages():
    assert {"rsketch.operators.base", "rsketch.linalg._lstsq", "rsketch.stats._bounds"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(
        module, extraglobs={"np": np}, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def public_names():
    import rsketch.linalg
    import rsketch.stats

    for module in (rsketch, rsketch.linalg, rsketch.stats, rsketch.operators):
        for name in module.__all__:
            obj = getattr(module, name)
            if callable(obj):  # SKETCH_KINDS is a table, documented where it is defined
                yield f"{module.__name__}.{name}", obj


@pytest.mark.parametrize("name, obj", list(public_names()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_public_name_has_an_example(name, obj):
    assert "Examples\n" in (obj.__doc__ or ""), f"{name} has no Examples section"
