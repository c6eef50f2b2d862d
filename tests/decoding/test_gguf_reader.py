"""The GGUF reader: round trip, independent dequantization, and corrupt files -> ValueError."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decoding import LlamaConfig, Model, Tokenizer
from decoding.gguf_reader import dequantize, read_gguf

from .tiny_llama import write_tiny_llama

Q = gguf.GGMLQuantizationType


def load_all(path):
    """Everything a model load does (weights and tokenizer); returns the model."""
    f = read_gguf(path)
    Tokenizer.from_metadata(f.metadata)
    return Model.from_gguf(f, dtype=np.float64)


def test_round_trip_float64(tiny_path):
    path, weights = tiny_path
    f = read_gguf(path)
    assert f.metadata["general.architecture"] == "llama"
    cfg = LlamaConfig.from_metadata(f.metadata)
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff) == (2, 32, 4, 2, 48)
    assert cfg.vocab_size == len(f.metadata["tokenizer.ggml.tokens"])
    assert set(f.tensors) == set(weights)
    for name, w in weights.items():
        assert f.tensors[name].shape == w.shape
        np.testing.assert_array_equal(f.tensor(name, dtype=np.float64), w)


def _ref_dequant_q8_0(raw, n):
    out = []
    for blk in raw.reshape(-1, 34):
        d = struct.unpack("<e", bytes(blk[:2]))[0]
        out += [d * q for q in struct.unpack("<32b", bytes(blk[2:]))]
    return np.array(out[:n])


def _ref_dequant_q4_1(raw, n):
    out = []
    for blk in raw.reshape(-1, 20):
        d, m = struct.unpack("<ee", bytes(blk[:4]))
        qs = blk[4:]
        out += [d * (int(b) & 15) + m for b in qs] + [d * (int(b) >> 4) + m for b in qs]
    return np.array(out[:n])


@pytest.mark.parametrize(
    ("qtype", "ref", "tol"),
    [(Q.Q8_0, _ref_dequant_q8_0, 0.02), (Q.Q4_1, _ref_dequant_q4_1, 0.2), (Q.F16, None, 1e-3)],
)
def test_quantized_types_match_scalar_reference(tmp_path, qtype, ref, tol):
    path = tmp_path / "q.gguf"
    original = write_tiny_llama(path, tensor_type=Q.F64, seed=3, d_ff=64)  # the unquantized weights
    qpath = tmp_path / "q2.gguf"
    write_tiny_llama(qpath, tensor_type=qtype, seed=3, d_ff=64)
    f = read_gguf(qpath)
    name = "blk.1.ffn_down.weight"
    assert f.tensors[name].ggml_type == qtype
    got = f.tensor(name, dtype=np.float64)
    if ref is not None:
        np.testing.assert_array_equal(got.ravel(), ref(f.raw(name), got.size))
    # and quantization error is small relative to the weights' scale
    assert np.max(np.abs(got - original[name])) < tol * np.max(np.abs(original[name]))
    model = Model.from_gguf(f, dtype=np.float32)
    assert model.layers[1].w_down.dtype == np.float32


def test_unsupported_type_is_named(tmp_path):
    path = tmp_path / "q5.gguf"
    write_tiny_llama(path, tensor_type=Q.Q5_0, d_ff=64)
    f = read_gguf(path)
    with pytest.raises(ValueError, match="Q5_0"):
        f.tensor("blk.0.attn_q.weight")
    with pytest.raises(ValueError, match="unsupported GGUF tensor type"):
        dequantize(np.zeros(22, np.uint8), Q.Q5_0, (32,))


def test_truncated_at_every_region_raises(tiny_path, tmp_path):
    data = tiny_path[0].read_bytes()
    for cut in [0, 3, 4, 8, 16, 23, 24, 40, 100, 1000, 3000, len(data) // 2, len(data) - 1]:
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(data[:cut])
        with pytest.raises(ValueError):
            load_all(p)


def test_header_errors_are_explained(tiny_path, tmp_path):
    data = bytearray(tiny_path[0].read_bytes())
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGML" + data[4:])
    with pytest.raises(ValueError, match="magic"):
        read_gguf(p)
    p.write_bytes(data[:4] + struct.pack("<I", 7) + data[8:])
    with pytest.raises(ValueError, match="version 7"):
        read_gguf(p)
    p.write_bytes(data[:16] + struct.pack("<Q", 2**60) + data[24:])
    with pytest.raises(ValueError, match="metadata count"):
        read_gguf(p)


def test_wrong_architecture_and_missing_keys(tmp_path):
    p = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(p), "gpt2")
    w.add_tensor("x", np.zeros(32, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="architecture"):
        Model.from_gguf(read_gguf(p))
    with pytest.raises(ValueError, match="head_count"):
        LlamaConfig.from_metadata({"general.architecture": "llama"})


V = gguf.GGUFValueType


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("llama.vocab_size", ("abc", V.STRING), r"'llama.vocab_size' must be an integer, got string 'abc'"),
        (
            "llama.vocab_size",
            ([264, 264], V.ARRAY),
            r"'llama.vocab_size' must be an integer, got array of 2 int32",
        ),
        ("llama.vocab_size", (264.7, V.FLOAT32), r"'llama.vocab_size' must be an integer, got float 264.7"),
        ("llama.vocab_size", (True, V.BOOL), r"'llama.vocab_size' must be an integer, got bool True"),
        (
            "llama.rope.dimension_count",
            ([8, 8], V.ARRAY),
            r"'llama.rope.dimension_count' must be an integer, got array",
        ),
        (
            "llama.rope.dimension_count",
            ("8", V.STRING),
            r"'llama.rope.dimension_count' must be an integer, got string '8'",
        ),
        (
            "general.architecture",
            (["llama"], V.ARRAY),
            r"general.architecture must be a string, got array of 1 strings",
        ),
    ],
)
def test_ill_typed_config_metadata_is_named(tmp_path, key, value, match):
    # int() of the value gave "invalid literal for int()" or "only 0-dimensional arrays", truncated
    # 264.7, and an array or the string "8" failed in the comparison with head_dim
    p = tmp_path / "bad.gguf"
    write_tiny_llama(p, metadata={key: value})
    with pytest.raises(ValueError, match=f"^GGUF {'metadata ' if key.startswith('llama') else ''}{match}"):
        load_all(p)


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        (
            "tokenizer.ggml.pre",
            (["smollm"], V.ARRAY),
            "tokenizer.ggml.pre must be a string, got array of 1 strings",
        ),
        (
            "tokenizer.ggml.model",
            ([1, 2], V.ARRAY),
            "tokenizer.ggml.model must be a string, got array of 2 int32",
        ),
        (
            "tokenizer.ggml.eos_token_id",
            (True, V.BOOL),
            "tokenizer.ggml.eos_token_id must be an integer token id, got bool",
        ),
        (
            "tokenizer.ggml.bos_token_id",
            ("1", V.STRING),
            "tokenizer.ggml.bos_token_id must be an integer token id, got string",
        ),
        (
            "tokenizer.ggml.eos_token_id",
            (264, V.UINT32),
            r"tokenizer.ggml.eos_token_id 264 is not a token id \(the vocabulary has 264\)",
        ),
        (
            "tokenizer.ggml.token_type",
            (["3"] * 264, V.ARRAY),
            "tokenizer.ggml.token_type must be an array of integers, got array of 264 strings",
        ),
        (
            "tokenizer.ggml.token_type",
            ([True] * 264, V.ARRAY),
            "tokenizer.ggml.token_type must be an array of integers, got array of 264 bool",
        ),
        (
            "tokenizer.ggml.add_bos_token",
            ("false", V.STRING),
            "tokenizer.ggml.add_bos_token must be a bool, got string 'false'",
        ),
        ("tokenizer.chat_template", (5, V.INT32), "tokenizer.chat_template must be a string, got integer 5"),
    ],
)
def test_ill_typed_tokenizer_metadata_is_named(tmp_path, key, value, match):
    # an array pre was "unhashable type: 'list'", a BOOL eos id was token 1, string token types
    # silently dropped every special token, and the string "false" turned add_bos on
    p = tmp_path / "bad.gguf"
    write_tiny_llama(p, metadata={key: value})
    with pytest.raises(ValueError, match=f"^GGUF {match}"):
        Tokenizer.from_metadata(read_gguf(p).metadata)


def test_non_finite_tensor_data_is_rejected(tiny_path, tmp_path):
    path, weights = tiny_path
    f = read_gguf(path)
    info = f.tensors["blk.0.ffn_up.weight"]
    data = bytearray(path.read_bytes())
    data[info.offset : info.offset + 8] = struct.pack("<d", float("nan"))
    p = tmp_path / "nan.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="non-finite"):
        load_all(p)


def test_a_float64_value_beyond_float32_is_named_without_a_warning(tiny_path, tmp_path):
    # NumPy's "overflow encountered in cast" escaped first, then the error called a finite value
    # "non-finite (corrupt data?)" (a probe, 2026-12-07)
    import warnings

    path, _ = tiny_path
    info = read_gguf(path).tensors["blk.0.attn_q.weight"]
    data = bytearray(path.read_bytes())
    data[info.offset : info.offset + 8] = struct.pack("<d", 1e300)
    p = tmp_path / "big.gguf"
    p.write_bytes(bytes(data))
    f = read_gguf(p)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="beyond float32's range: load it with dtype=numpy.float64"):
            f.tensor("blk.0.attn_q.weight", np.float32)
    assert f.tensor("blk.0.attn_q.weight", np.float64).reshape(-1)[0] == 1e300


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "small.gguf"
    write_tiny_llama(path, n_layers=1, d=8, n_heads=2, n_kv_heads=1, d_ff=8, tensor_type=Q.F32)
    data = path.read_bytes()
    header_end = min(t.offset for t in read_gguf(path).tensors.values())
    return data, header_end


def _check_loads_or_value_error(data, tmp_path):
    p = tmp_path / "fuzz.gguf"
    p.write_bytes(data)
    try:
        load_all(p)
    except ValueError:
        pass


@settings(max_examples=60, deadline=10000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzz_truncated_files(small_file, tmp_path, data):
    raw, _ = small_file
    cut = data.draw(st.integers(0, len(raw) - 1))
    p = tmp_path / "t.gguf"
    p.write_bytes(raw[:cut])
    with pytest.raises(ValueError):
        load_all(p)


@settings(max_examples=300, deadline=10000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzz_mutated_headers(small_file, tmp_path, data):
    """Mutating header/metadata/tensor-info bytes either still gives a valid file or raises ValueError."""
    raw, header_end = small_file
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, header_end - 1))
        buf[i] = data.draw(st.integers(0, 255))
    _check_loads_or_value_error(bytes(buf), tmp_path)


@settings(max_examples=40, deadline=10000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzz_mutated_lengths(small_file, tmp_path, data):
    """Large values written over any 8-byte-aligned header word: still ValueError, quickly."""
    raw, header_end = small_file
    buf = bytearray(raw)
    i = data.draw(st.integers(0, header_end - 8))
    buf[i : i + 8] = struct.pack("<Q", data.draw(st.sampled_from([2**32, 2**40, 2**63, 2**64 - 1, 12345678])))
    _check_loads_or_value_error(bytes(buf), tmp_path)


@settings(max_examples=30, deadline=10000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzz_mutated_tensor_data(small_file, tmp_path, data):
    raw, header_end = small_file
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(header_end, len(raw) - 1))
        buf[i] = data.draw(st.integers(0, 255))
    _check_loads_or_value_error(bytes(buf), tmp_path)
