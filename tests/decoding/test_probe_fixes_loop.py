"""Found by probing the engine: non-finite logits decoded as token 0, a tokenizer whose vocabulary
is not the model's, the CLI's --batch copies made before any memory check, a drafter's missing or
malformed drafts."""

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


class _Returns(Drafter):
    """Returns ``value`` from propose, whatever it is."""

    name = "returns"

    def __init__(self, value):
        self.value = value

    def propose(self, contexts, max_tokens, samples):
        return self.value(samples)


# a custom drafter's slip had met a bare AttributeError ('list' object has no attribute 'tokens')
@pytest.mark.parametrize(
    ("value", "got"),
    [
        (lambda samples: [np.array([1]) for _ in samples], "list"),
        (lambda samples: None, "NoneType"),
        (lambda samples: Proposal(np.array([1]) for _ in samples), "generator"),
    ],
)
def test_a_drafter_that_returns_no_proposal_is_named(tiny64, value, got):
    model, tok = tiny64
    with pytest.raises(
        TypeError, match=rf"^drafter 'returns' proposed a {got} \(Drafter\.propose returns a Proposal"
    ):
        decoding.generate(
            model, tok, [[1, 2, 3], [4, 5]], max_new_tokens=4, method="ems", drafter=_Returns(value)
        )


class _OtherVocabulary:
    """A tokenizer of another model: 300 tokens where the tiny model has 264."""

    vocab_size = 300

    def encode(self, text):
        return [1, 2, 3]

    def decode(self, ids):
        return ""


@pytest.mark.parametrize("prompt", ["hello", [1, 2, 3]])
def test_a_tokenizer_of_another_model_is_refused_before_decoding(tiny64, prompt):
    model, _ = tiny64
    with pytest.raises(ValueError, match="^tokenizer has 300 tokens and the model 264: give the model's own"):
        decoding.generate(model, _OtherVocabulary(), [prompt], max_new_tokens=2)


class _Fixed(Drafter):
    """Proposes ``draft`` for sample 1 and an empty list (float64 to NumPy) for every other."""

    name = "fixed"

    def __init__(self, draft):
        self.draft = draft

    def propose(self, contexts, max_tokens, samples):
        return Proposal([self.draft if s == 1 else [] for s in samples])


@pytest.mark.parametrize("layout", ["ems", "vanilla"])
@pytest.mark.parametrize(
    ("draft", "exc", "match"),
    [
        (
            [264],
            ValueError,
            r"^drafter 'fixed' proposed token id 264 at index 0 for sample 1, "
            r"outside the vocabulary \[0, 264\)$",
        ),
        (
            np.array([3, 10**6]),
            ValueError,
            r"^drafter 'fixed' proposed token id 1000000 at index 1 for sample 1",
        ),
        ((5, -1), ValueError, r"^drafter 'fixed' proposed token id -1 at index 1 for sample 1"),
        (
            np.array([2**63], dtype=np.uint64),
            ValueError,
            r"token id 9223372036854775808 at index 0 for sample 1",
        ),
        (
            np.array([[1, 2]]),
            TypeError,
            r"^drafter 'fixed' proposed a draft of shape \(1, 2\) \(ndarray\) for sample 1 \(",
        ),
        ("12", TypeError, r"^drafter 'fixed' proposed a draft of shape \(\) \(str\) for sample 1"),
        (np.int64(5), TypeError, r"^drafter 'fixed' proposed a draft of shape \(\) \(int64\) for sample 1"),
        (["1", "2"], TypeError, r"^drafter 'fixed' proposed a draft of dtype <U1 for sample 1"),
        ([1.7], TypeError, r"^drafter 'fixed' proposed a draft of dtype float64 for sample 1"),
        ([True], TypeError, r"^drafter 'fixed' proposed a draft of dtype bool for sample 1"),
        (
            [[1], [2, 3]],
            TypeError,
            r"^drafter 'fixed' proposed a draft NumPy cannot read as an array \(list: ",
        ),
    ],
)
def test_a_drafter_that_proposes_a_malformed_draft_is_named(tiny64, layout, draft, exc, match):
    # the model's "token ids must be in [0, V)" named neither the drafter nor the sample, a 2-D or
    # string draft gave NumPy's own errors, and [1.7] was token 1
    model, tok = tiny64
    assert model.config.vocab_size == 264
    with pytest.raises(exc, match=match):
        decoding.generate(
            model, tok, [[1, 2, 3], [4, 5]], max_new_tokens=4, method=layout, drafter=_Fixed(draft),
            draft_budget=None,
        )  # fmt: skip


@pytest.mark.parametrize("draft", [[], (), np.zeros(0), np.array([7, 9], dtype=np.uint8), [np.int32(7), 9]])
def test_empty_and_integer_drafts_of_any_kind_are_taken(tiny64, draft):
    model, tok = tiny64
    ref = decoding.generate(model, tok, [[1, 2, 3], [4, 5]], max_new_tokens=6)
    for layout in ("ems", "vanilla"):
        res = decoding.generate(
            model, tok, [[1, 2, 3], [4, 5]], max_new_tokens=6, method=layout, drafter=_Fixed(draft),
            draft_budget=None,
        )  # fmt: skip
        assert res.tokens == ref.tokens


def test_draft_tokens_past_the_room_are_not_checked(tiny64):
    # the loop keeps max_draft tokens of a draft: an id past them is never used, so never refused
    model, tok = tiny64
    ref = decoding.generate(model, tok, [[1, 2, 3], [4, 5]], max_new_tokens=6)
    for layout in ("ems", "vanilla"):
        res = decoding.generate(
            model, tok, [[1, 2, 3], [4, 5]], max_new_tokens=6, method=layout, drafter=_Fixed([7, 9, 10**6]),
            max_draft=2, draft_budget=None,
        )  # fmt: skip
        assert res.tokens == ref.tokens


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


class _Waiting(Drafter):
    """Proposes nothing; its first proposal waits until ``go`` is set (signalling ``inside`` first)."""

    name = "waiting"

    def __init__(self):
        import threading

        self.inside, self.go = threading.Event(), threading.Event()

    def propose(self, contexts, max_tokens, samples):
        self.inside.set()
        assert self.go.wait(30)
        return Proposal([[] for _ in samples])


@pytest.mark.parametrize("method", ["ems", "vanilla"])
def test_a_drafter_object_serves_one_call_at_a_time(tiny64, method):
    # Its state is the call's (begin() sets it up): two calls at once on one DraftModelDrafter or
    # LLMADrafter raised KeyError, IndexError or "cache capacity" in 4 of 10 calls. The second call
    # is now refused before it touches the drafter; after the first ends, the drafter serves again.
    import threading

    model, tok = tiny64
    ref = decoding.generate(model, tok, [[1, 2, 3]], max_new_tokens=6)
    drafter, results = _Waiting(), []
    kw = dict(max_new_tokens=6, method=method, drafter=drafter)
    first = threading.Thread(target=lambda: results.append(decoding.generate(model, tok, [[1, 2, 3]], **kw)))
    first.start()
    assert drafter.inside.wait(30)
    try:
        with pytest.raises(RuntimeError, match="drafter 'waiting' is in use by another generate call"):
            decoding.generate(model, tok, [[4, 5]], **kw)
    finally:
        drafter.go.set()
        first.join(30)
    assert results[0].tokens == ref.tokens
    assert decoding.generate(model, tok, [[1, 2, 3]], **kw).tokens == ref.tokens  # free again
    bad = _Fixed([999])
    for _ in range(2):  # an error inside the call frees the drafter too: the same error again
        with pytest.raises(ValueError, match="outside the vocabulary"):
            decoding.generate(model, tok, [[1, 2, 3], [4, 5]], max_new_tokens=6, method=method, drafter=bad)
