"""The docstring examples of the decoding modules run (those that need the real model are skipped)."""

import doctest
import importlib

import numpy as np
import pytest


@pytest.mark.parametrize(
    "module",
    ["__init__", "config", "kv_cache", "attention", "sampling", "results", "model", "gguf_reader", "tokenizer"]
    + ["api", "kernels"],
)
def test_docstring_examples(module):
    mod = importlib.import_module("decoding" if module == "__init__" else f"decoding.{module}")
    res = doctest.testmod(mod, extraglobs={"np": np}, optionflags=doctest.ELLIPSIS)
    assert res.failed == 0
