"""The engine's own dependencies, checked before anything imports them.

They come with the ``decoding`` extra (``pip install "rsketch[decoding]"``); sketching users install
rsketch without them, and importing :mod:`decoding` then says which extra to add instead of failing
deep inside a module on ``import gguf``.

Examples
--------
>>> missing(["json", "no_such_module_here"])
['no_such_module_here']
"""

import importlib.util

REQUIRED = ("gguf", "tokenizers", "jinja2")


def missing(names=REQUIRED) -> list[str]:
    """The names among ``names`` that cannot be imported."""
    return [name for name in names if importlib.util.find_spec(name) is None]


if missing():
    raise ImportError(
        f"decoding needs {', '.join(missing())}, which come with the 'decoding' extra: "
        "pip install 'rsketch[decoding]'"
    )
