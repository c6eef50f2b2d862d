"""The docstring examples of every decoding module run (those marked +SKIP, needing the real model, with it).

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


#: Examples that stay skipped with the real model too: they need a GPU.
NEEDS_A_GPU = {"decoding.model.Model.to_device"}


@pytest.mark.parametrize("module", MODULES)
def test_real_model_docstring_examples(module, real_model, real_model_file):
    # The examples marked +SKIP need the real model (the packaged SmolLM2): they run here with it,
    # as `model`, `tok` (and `target`), `path` and `gguf_file`; two had shown wrong output unseen.
    from decoding.gguf_reader import read_gguf

    model, tok = real_model
    path = str(real_model_file)
    extra = {"np": np, "model": model, "tok": tok, "target": model, "path": path}
    extra["gguf_file"] = read_gguf(path)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in doctest.DocTestFinder().find(importlib.import_module(module)):
        if test.name in NEEDS_A_GPU or not any(ex.options.get(doctest.SKIP) for ex in test.examples):
            continue
        for example in test.examples:
            example.options.pop(doctest.SKIP, None)
        test.globs.update(extra)
        assert runner.run(test).failed == 0, test.name
