"""Found by probing the engine: non-finite logits decoded as token 0, a tokenizer whose vocabulary
is not the model's, the CLI's --batch copies made before any memory check, a drafter's missing drafts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

import decoding
from decoding.drafters import Drafter, Proposal
from decoding.sampling import SamplingParams, TokenNoise, filtered_probs, greedy, sample

from .tiny_llama import tiny_vocab, write_tiny_llama


def test_greedy_and_sampling_refuse_non_finite_logits():
    # NumPy's argmax of a NaN row is 0: token 0, silently
    rows = np.array([[0.1, 0.5, 0.2], [np.nan, np.nan, np.nan]])
    with pytest.raises(FloatingPointError, match=r"not finite .* row\(s\) \[1\]"):
        greedy(rows)
    with pytest.raises(FloatingPointError, match="not finite"):
        greedy(np.array([[0.1, np.nan, 0.2]]))  # one NaN, not in the first place
    with pytest.raises(FloatingPointError, match="not finite"):
        filtered_probs(np.array([[0.0, np.inf, 1.0]]), 1.0)
    with pytest.raises(FloatingPointError):
        sample(rows, SamplingParams(temperature=0.8), TokenNoise(0), [0, 1], [0, 0])
    assert greedy(np.array([[0.1, 0.5, -np.inf]])).tolist() == [1]  # masked entries are fine


@pytest.fixture(scope="module")
def overflowing(tmp_path_factory):
    # finite weights whose keys and values pass 65504: inf in the float16 KV cache, NaN logits
    path = tmp_path_factory.mktemp("big") / "big.gguf"
    write_tiny_llama(path, d=64, d_ff=64, tensor_type=gguf.GGMLQuantizationType.Q8_0, scale=1e4)
    return decoding.load_model(path)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"temperature": 0.8, "seed": 1},
        {"method": "ems", "drafter": "llma"},
        {"method": "vanilla", "drafter": "llma"},
    ],
)
def test_a_model_whose_activations_overflow_raises_instead_of_decoding_token_0(overflowing, kw):
    model, tok = overflowing
    assert model.kv_dtype == np.float16
    with pytest.raises(FloatingPointError, match="kv_dtype = numpy.float32"):
        decoding.generate(model, tok, [[1, 2, 3]], max_new_tokens=6, draft_budget=None, **kw)


def test_a_tokenizer_of_another_size_than_the_model_is_refused_at_load(tmp_path):
    tokens, _, types = tiny_vocab()
    extra = [f"<extra_{i}>" for i in range(200)]
    path = tmp_path / "more_tokens.gguf"
    write_tiny_llama(
        path,
        metadata={
            "tokenizer.ggml.tokens": (tokens + extra, gguf.GGUFValueType.ARRAY),
            "tokenizer.ggml.token_type": (types + [1] * 200, gguf.GGUFValueType.ARRAY),
        },
    )
    with pytest.raises(ValueError, match="tokenizer has 464 tokens .* model's vocabulary is 264"):
        decoding.load_model(path)


def test_the_cli_checks_a_huge_batch_before_copying_the_prompt(tiny_path):
    # --batch 100000000 tokenized every copy first (about 9 minutes and 30 GB by extrapolation)
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "decoding", "generate", "hi", "--model", str(tiny_path[0]),
         "--batch", "100000000", "--max-new-tokens", "2"],
        capture_output=True, text=True, timeout=60, cwd=root,
    )  # fmt: skip
    assert proc.returncode != 0 and "--batch 100000000" in proc.stderr + proc.stdout


class _Short(Drafter):
    name = "short"

    def propose(self, contexts, max_tokens, samples):
        return Proposal([np.array([1])])  # one draft, whatever the batch


def test_a_drafter_that_proposes_too_few_drafts_is_named(tiny64):
    model, tok = tiny64
    with pytest.raises(ValueError, match="drafter 'short' proposed 1 drafts for 2 samples"):
        decoding.generate(model, tok, [[1, 2, 3], [4, 5]], max_new_tokens=4, method="ems", drafter=_Short())


def test_scalar_costs_are_the_arrays_costs():
    # the allocation calls cost() tens of times a step with Python numbers: a path of its own
    # (14 us a call through the arrays' checks), the same arithmetic
    from decoding.cost_model import CostModel

    cm = CostModel(
        tokens=(1, 2, 4, 8, 9, 16, 17, 32, 64),
        seconds=(0.006, 0.0061, 0.007, 0.010, 0.012, 0.017, 0.018, 0.029, 0.054),
        per_sequence=1e-4,
    )
    rng = np.random.default_rng(0)
    xs = np.concatenate([rng.uniform(0, 200, 500), np.arange(0.0, 130.0), [64.0]])
    seqs = rng.integers(0, 20, xs.size)
    scalar = [cm.cost(float(x), int(q)) for x, q in zip(xs, seqs, strict=True)]
    np.testing.assert_array_equal(scalar, cm.cost(xs, seqs))
    for bad in (float("nan"), -1, float("inf")):
        with pytest.raises(ValueError, match="n_tokens must be finite and >= 0"):
            cm.cost(bad)
