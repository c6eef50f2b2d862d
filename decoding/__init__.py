"""decoding: a small Llama inference engine with packed batches and multi-sample speculative decoding.

>>> import decoding
>>> model, tokenizer = decoding.load_model()  # doctest: +SKIP
>>> messages = [{"role": "user", "content": "What is the capital of Germany?"}]
>>> prompt = tokenizer.apply_chat_template(messages)  # doctest: +SKIP
>>> decoding.generate(model, tokenizer, [prompt], max_new_tokens=16).texts  # doctest: +SKIP
['The capital of Germany is Berlin.']
"""

from . import _requirements  # noqa: F401  (first: a clear ImportError without the extra)
from .api import generate
from .config import LlamaConfig
from .cost_model import CostModel, DraftBudget
from .drafters import Drafter, DraftModelDrafter, LLMADrafter, PromptLookupDrafter, Proposal
from .kv_cache import KVCache
from .loading import LoadedModel, load_model
from .model import Model, PackedBatch
from .quantized import QuantizedMatrix
from .results import GenerationResult
from .sampling import SamplingParams
from .tokenizer import Tokenizer

__all__ = [
    "generate",
    "load_model",
    "LoadedModel",
    "GenerationResult",
    "Model",
    "PackedBatch",
    "QuantizedMatrix",
    "KVCache",
    "LlamaConfig",
    "SamplingParams",
    "Tokenizer",
    "Drafter",
    "Proposal",
    "LLMADrafter",
    "PromptLookupDrafter",
    "DraftModelDrafter",
    "CostModel",
    "DraftBudget",
]
