"""The docstring examples of every decoding module run (those that need the real model are skipped).

The modules are found on disk, so a new module is covered without editing this file.
"""

import doctest
import importlib
import pkgutil

import numpy as np
import pytest

import decoding

MODULES = ["decoding"] + sorted(f"decoding.{m.name}" for m in pkgutil.iter_modules(decoding.__path__))


def test_every_module_is_found():
    assert {"decoding.api", "decoding.speculative", "decoding.scheduling", "decoding.gguf_reader"} <= set(
        MODULES
    )


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples(module):
    mod = importlib.import_module(module)
    res = doctest.testmod(mod, extraglobs={"np": np}, optionflags=doctest.ELLIPSIS)
    assert res.failed == 0
