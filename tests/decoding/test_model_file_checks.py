"""A probe's findings on corrupt or hostile model files: tensor data that overlaps or leaves gaps,
records checked only after the weights were read, activations whose squares overflow float32,
RoPE scaling ignored, names quoted whole, and chat templates recompiled or amplified unchecked."""

from __future__ import annotations

import struct
import threading
import time
import tracemalloc

import gguf
import numpy as np
import pytest

from decoding import cli, load_model
from decoding import tokenizer as tokenizer_module
from decoding.gguf_reader import GGUFFile, read_gguf
from decoding.kernels import rms_norm
from decoding.tokenizer import Tokenizer

from .tiny_llama import TINY_TEMPLATE, write_tiny_llama

Q = gguf.GGMLQuantizationType
V = gguf.GGUFValueType
MSG = [{"role": "user", "content": "hi"}]


# -- helpers: byte surgery on a GGUF file's tensor records --------------------------------------------
def _records(data: bytes, names) -> dict[str, dict[str, int]]:
    """File positions of each named tensor record's fields: ``name`` (its length prefix), ``dims``,
    ``type``, ``offset`` and ``end`` (the record's end)."""
    out = {}
    for name in names:
        key = struct.pack("<Q", len(name)) + name.encode()
        pos = data.index(key)
        dims = pos + len(key) + 4
        (n_dims,) = struct.unpack_from("<I", data, pos + len(key))
        typ = dims + 8 * n_dims
        out[name] = {"name": pos, "dims": dims, "type": typ, "offset": typ + 4, "end": typ + 12}
    return out


def _patched(path, tmp_path, edits, name="patched.gguf"):
    """A copy of ``path`` with ``edits`` ``(tensor, field, bytes)`` written over its records' fields."""
    data = bytearray(path.read_bytes())
    rec = _records(bytes(data), {t for t, _, _ in edits})
    for tensor, field, value in edits:
        data[rec[tensor][field] : rec[tensor][field] + len(value)] = value
    out = tmp_path / name
    out.write_bytes(bytes(data))
    return out


def _renamed(path, tmp_path, old: str, new: str):
    """A copy of ``path`` whose tensor ``old`` is called ``new`` (the header re-padded: the data
    offsets are relative to the data section, so they stay valid)."""
    f = read_gguf(path)
    data = path.read_bytes()
    rec = _records(data, f.tensors)
    header_end = max(r["end"] for r in rec.values())
    data_start = min(t.offset for t in f.tensors.values())
    a = rec[old]["name"]
    header = data[:a] + struct.pack("<Q", len(new)) + new.encode() + data[a + 8 + len(old) : header_end]
    header += b"\0" * (-len(header) % f.alignment)
    out = tmp_path / "renamed.gguf"
    out.write_bytes(header + data[data_start:])
    return out


def _data_offset(f: GGUFFile, name: str) -> int:
    """The offset of a tensor's data as its record stores it (relative to the data section)."""
    return f.tensors[name].offset - min(t.offset for t in f.tensors.values())


@pytest.fixture(scope="module")
def f32_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("checks") / "f32.gguf"
    write_tiny_llama(path, tensor_type=Q.F32)
    return path


@pytest.fixture(scope="module")
def f16_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("checks") / "f16.gguf"
    write_tiny_llama(path, tensor_type=Q.F16, d_ff=64)
    return path


@pytest.fixture
def no_weight_read(monkeypatch):
    """Fails a test that reads any weight's bytes."""

    def refuse(self, name):
        raise AssertionError(f"weight {name} read before the records were checked")

    monkeypatch.setattr(GGUFFile, "raw", refuse)


# -- 1 + 3. tensor data must follow one another, as llama.cpp requires ---------------------------------
def test_tensors_that_share_their_data_are_refused(f32_path, tmp_path):
    # every matrix of block 1 pointed at block 0's bytes: a 2.7 MB file had loaded 43 GB of weights
    f = read_gguf(f32_path)
    names = [n for n in f.tensors if n.startswith("blk.1.")]
    edits = [(n, "offset", struct.pack("<Q", _data_offset(f, "blk.0." + n[6:]))) for n in names]
    bad = _patched(f32_path, tmp_path, edits)
    with pytest.raises(ValueError, match=r"tensor 'blk\.1\.\w+\.weight' has data offset \d+, expected \d+"):
        read_gguf(bad)
    with pytest.raises(ValueError, match=str(bad)):
        load_model(bad)


def test_a_retyped_tensor_that_leaves_a_gap_is_refused(f32_path, tmp_path):
    # an F32 norm typed F16 reads half its bytes and leaves a gap; ones make every half finite
    # (1.0f is 0x3F800000: the halves 0.0 and 1.875), so it had loaded and generated
    f = read_gguf(f32_path)
    info = f.tensors["blk.0.attn_norm.weight"]
    bad = _patched(f32_path, tmp_path, [("blk.0.attn_norm.weight", "type", struct.pack("<I", Q.F16))])
    data = bytearray(bad.read_bytes())
    data[info.offset : info.offset + info.nbytes] = np.ones(info.nbytes // 4, "<f4").tobytes()
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"has data offset \d+, expected \d+"):
        load_model(bad, dtype=np.float64)


def test_files_written_by_gguf_and_the_real_model_pass(f32_path, real_model_file):
    for path in (f32_path, real_model_file):
        assert len(read_gguf(path).tensors) > 0


# -- 2. float32 norms of activations whose squares overflow ----------------------------------------
def test_rms_norm_of_rows_whose_squares_overflow():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 576)).astype(np.float32)
    w = rng.standard_normal(576).astype(np.float32)
    big = x * np.float32(1e20)  # squares of 1e40: inf in float32
    out = rms_norm(big, w, 1e-5)
    np.testing.assert_allclose(out, rms_norm(x, w, 1e-5), rtol=1e-5, atol=1e-5)
    assert np.array_equal(rms_norm(x, w, 1e-5)[0], rms_norm(x[:1], w, 1e-5)[0])  # other rows unchanged
    big[1, 7] = np.inf
    assert np.isnan(rms_norm(big, w, 1e-5)[1]).any() and np.isfinite(rms_norm(big, w, 1e-5)[[0, 2]]).all()


def test_rms_norm_array_path_gives_nan_not_zeros():
    import array_api_strict as xps

    x = xps.asarray(np.full((2, 4), 1e20, np.float32))
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.asarray(rms_norm(x, xps.asarray(np.ones(4, np.float32)), 1e-5))
    assert np.isnan(out).all()  # had been rows of zeros


def test_float32_logits_of_huge_activations_are_the_float64_ones(f32_path, tmp_path):
    # embedding rows of 1e20 (finite float32): the norm's squares had overflowed, every float32 logit
    # was 0 and greedy decoding emitted token 0
    info = read_gguf(f32_path).tensors["token_embd.weight"]
    data = bytearray(f32_path.read_bytes())
    rows = np.frombuffer(bytes(data[info.offset : info.offset + info.nbytes]), "<f4")
    data[info.offset : info.offset + info.nbytes] = (rows * np.float32(1e20)).astype("<f4").tobytes()
    path = tmp_path / "big_embd.gguf"
    path.write_bytes(bytes(data))
    argmax = {}
    for dtype in (np.float64, np.float32, "quantized"):
        model, tok = load_model(path, dtype=dtype)
        ids = tok.encode("the cat")
        cache = model.new_cache(max_seqs=1, capacity=8)
        seq = cache.allocate()
        logits = model.forward(
            np.array(ids), cache=cache, seq_ids=[seq], cu_seqlens=[0, len(ids)], logits="last"
        )
        assert np.isfinite(logits).all() and np.abs(logits).max() > 0
        argmax[str(dtype)] = int(logits.argmax())
    assert len(set(argmax.values())) == 1, argmax


# -- 7. every tensor record checked before any weight is read -----------------------------------------
@pytest.mark.parametrize(
    ("tensor", "field", "value", "match"),
    [
        ("token_embd.weight", "type", struct.pack("<I", Q.BF16), r"'token_embd\.weight' has type BF16"),
        (
            "blk.1.ffn_down.weight",
            "type",
            struct.pack("<I", Q.Q5_0),
            r"'blk\.1\.ffn_down\.weight' has type Q5_0",
        ),
        (
            "token_embd.weight",
            "dims",
            struct.pack("<QQ", 264, 32),
            r"'token_embd\.weight' has shape \(32, 264\)",
        ),
    ],
)
def test_bad_tensor_records_are_named_before_any_weight_is_read(
    f16_path, tmp_path, no_weight_read, tensor, field, value, match
):
    # found after every other weight was dequantized (4-5 s, 1.1 GB for SmolLM2), the type error
    # naming neither the file nor the tensor
    bad = _patched(f16_path, tmp_path, [(tensor, field, value)])
    for dtype in ("quantized", np.float32):
        with pytest.raises(ValueError, match=match) as info:
            load_model(bad, dtype=dtype)
        assert str(bad) in str(info.value)


def test_a_block_count_short_of_the_tensors_is_refused_before_any_weight(tmp_path, no_weight_read):
    path = tmp_path / "blocks.gguf"
    write_tiny_llama(path, n_layers=3, metadata={"llama.block_count": (2, V.UINT32)})
    with pytest.raises(
        ValueError, match=r"9 tensors that a llama model of llama.block_count 2 does not have"
    ):
        load_model(path)


# -- 8. integers before the tokenizer ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("metadata", "match"),
    [
        ({"llama.vocab_size": (10**6, V.UINT32)}, "the tokenizer has 264 tokens"),
        ({"general.architecture": ("gpt2", V.STRING)}, "architecture"),
    ],
)
def test_vocabulary_size_and_architecture_are_checked_before_the_tokenizer_is_built(
    tmp_path, monkeypatch, metadata, match
):
    # a 59 MB file of 3M tokens had taken 32 s and 1.9 GB to build its tokenizer before the
    # comparison of two integers refused it
    path = tmp_path / "vocab.gguf"
    write_tiny_llama(path, metadata=metadata)
    built = []
    monkeypatch.setattr(Tokenizer, "from_metadata", classmethod(lambda cls, md: built.append(md)))
    with pytest.raises(ValueError, match=match):
        load_model(path)
    assert built == []


# -- 9. RoPE scaling is refused, not ignored ---------------------------------------------------------
@pytest.mark.parametrize(
    ("metadata", "refused"),
    [
        (
            {"llama.rope.scaling.type": ("linear", V.STRING), "llama.rope.scaling.factor": (8.0, V.FLOAT32)},
            True,
        ),
        ({"llama.rope.scaling.factor": (4.0, V.FLOAT32)}, True),  # the type defaults to linear
        ({"llama.rope.scale_linear": (2.0, V.FLOAT32)}, True),  # the older key
        (
            {"llama.rope.scaling.type": ("yarn", V.STRING), "llama.rope.scaling.factor": (1.0, V.FLOAT32)},
            False,
        ),
        (
            {"llama.rope.scaling.type": ("none", V.STRING), "llama.rope.scaling.factor": (8.0, V.FLOAT32)},
            False,
        ),
        ({"llama.rope.scaling.factor": (0.0, V.FLOAT32)}, False),  # llama.cpp reads 0 as 1
    ],
)
def test_rope_scaling_is_refused(tmp_path, metadata, refused):
    path = tmp_path / "rope.gguf"
    write_tiny_llama(path, metadata=metadata)
    if refused:
        with pytest.raises(ValueError, match=r"scaled RoPE is not supported"):
            load_model(path, dtype=np.float64)
    else:
        load_model(path, dtype=np.float64)


# -- 10. non-finite logits at the command line --------------------------------------------------------
def test_cli_reports_non_finite_logits_as_an_error(f32_path, tmp_path, capsys):
    info = read_gguf(f32_path).tensors["output_norm.weight"]
    data = bytearray(f32_path.read_bytes())
    norm = np.frombuffer(bytes(data[info.offset : info.offset + info.nbytes]), "<f4") * np.float32(3e37)
    data[info.offset : info.offset + info.nbytes] = norm.astype("<f4").tobytes()
    path = tmp_path / "huge_norm.gguf"
    path.write_bytes(bytes(data))
    assert cli.main(["generate", "the cat", "--model", str(path), "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "Traceback" not in err


# -- 11. general.alignment must be an integer, not a bool ---------------------------------------------
def test_a_bool_alignment_is_refused(tmp_path):
    path = tmp_path / "align.gguf"
    write_tiny_llama(path, metadata={"general.alignment": (True, V.BOOL)})
    with pytest.raises(ValueError, match=r"general\.alignment must be an unsigned integer.*bool True"):
        read_gguf(path)


# -- 12. names from the file are quoted cut ------------------------------------------------------------
def test_long_names_are_cut_in_messages(f32_path, tmp_path):
    long = "A" * 100_000 + "output_norm.weight"
    renamed = _renamed(f32_path, tmp_path, "output_norm.weight", long)
    with pytest.raises(ValueError, match="100018 characters") as info:
        load_model(renamed, dtype=np.float64)
    assert len(str(info.value)) < 500
    bad = _patched(renamed, tmp_path, [(long, "type", struct.pack("<I", 99))], name="type99.gguf")
    with pytest.raises(ValueError, match="unknown type id 99") as info:
        read_gguf(bad)
    assert len(str(info.value)) < 500
    md = dict(read_gguf(f32_path).metadata)
    for key, value in (("tokenizer.ggml.merges", ["a " + long]), ("tokenizer.ggml.pre", long)):
        with pytest.raises(ValueError) as info:
            Tokenizer.from_metadata({**md, key: value})
        assert len(str(info.value)) < 500


# -- 6. the chat template: its length capped, compiled once ------------------------------------------
def _tokenizer(tiny64, template):
    tok = tiny64.tokenizer
    return Tokenizer(
        tok._hf, bos_id=tok.bos_id, eos_id=tok.eos_id, add_bos=False, id_to_token=tok._id_to_token,
        chat_template=template,
    )  # fmt: skip


def test_a_template_longer_than_64k_is_refused(tiny64):
    # 700 KB of template had taken 9 s and 1.2 GB, at every call
    padded = _tokenizer(tiny64, TINY_TEMPLATE + "{# " + "x" * 70_000 + " #}")
    t0 = time.perf_counter()
    with pytest.raises(
        ValueError, match=r"tokenizer\.chat_template has 70,\d{3} characters, over the 65,536"
    ):
        padded.apply_chat_template(MSG)
    assert time.perf_counter() - t0 < 1
    assert _tokenizer(tiny64, TINY_TEMPLATE + "{# " + "x" * 60_000 + " #}").apply_chat_template(MSG)


def test_the_template_is_compiled_once(tiny64, monkeypatch):
    compiled = []
    real = tokenizer_module.compile_chat_template

    def counting(source, *args):
        compiled.append(source)
        return real(source, *args)

    monkeypatch.setattr(tokenizer_module, "compile_chat_template", counting)
    tok = _tokenizer(tiny64, TINY_TEMPLATE)
    first = tok.apply_chat_template(MSG)
    for _ in range(3):
        assert tok.apply_chat_template(MSG) == first
    assert compiled == [TINY_TEMPLATE]
    tok.chat_template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"  # a new one: compiled
    assert tok.apply_chat_template(MSG) == "[hi]" and len(compiled) == 2


def test_threads_count_their_own_steps_on_a_shared_template(tiny64):
    # 198,000 steps each (range items and loop iterations), under the 200,000 of one rendering,
    # over them together: counters shared by the threads failed both renderings
    tok = _tokenizer(tiny64, "{% for i in range(99000) %}{% endfor %}{{ messages[0]['content'] }}")
    results, errors = [], []

    def render():
        try:
            results.append(tok.apply_chat_template(MSG))
        except ValueError as e:
            errors.append(e)

    threads = [threading.Thread(target=render) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and results == ["hi", "hi"]


# -- 4, 5. template filters and operators sized before they run ---------------------------------------
@pytest.mark.parametrize(
    ("template", "what"),
    [
        ("{{ ('\\t' * 300).expandtabs(1000000)|length }}", "expandtabs"),
        ("{{ ('a' * 300).translate({97: 'b' * 1000000})|length }}", "translate"),
        ("{{ ('{0:>{1}}'.format('a', '300000000'))|length }}", "width or precision of 300,000,000"),
        ("{{ ([[0] * 1000000] * 40)|sum(start=[])|length }}", "copy by sum"),
        ("{{ ([[0]] * 100000)|sum(start=[])|length }}", "copy by sum"),  # 1e5 lists of one item: 5e9 copies
        ("{% set x = 2**4000000 %}{% set a = x*x %}{% set b = a*a %}{% set c = b*b %}{{ 1 }}", "multiplies"),
    ],
)
def test_amplifying_filters_are_sized_before_they_run(tiny64, template, what):
    bad = _tokenizer(tiny64, template)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=rf"tokenizer\.chat_template .*{what}"):
        bad.apply_chat_template(MSG)
    assert time.perf_counter() - t0 < 2


# tojson's indent multiplies by the nesting depth, wordwrap's wrapstring by the lines: their results
# had been sized only after they were built (144 MB at depth 12, 200 MB for 2,000 characters)
@pytest.mark.parametrize(
    "template",
    [
        "{{ " + "[" * 12 + "1" + "]" * 12 + "|tojson(indent=1000000) }}",
        "{{ " + "[" * 20 + "1" + "]" * 20 + "|tojson(indent=' ' * 1000000) }}",
        "{{ {'a': {'b': {'c': {'d': [1, 2, 3]}}}}|tojson(1000000) }}",
        "{{ ('a' * 2000)|wordwrap(1, wrapstring=' ' * 100000) }}",
        "{{ ('a' * 2000)|wordwrap(1, True, ' ' * 100000) }}",
    ],
)
def test_nested_and_wrapped_output_is_sized_before_it_is_built(tiny64, template):
    bad = _tokenizer(tiny64, template)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"tokenizer\.chat_template would build by (tojson|wordwrap)"):
            bad.apply_chat_template(MSG)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20e6


def test_real_uses_of_those_filters_still_render(tiny64):
    template = (
        "{{ 'a\\tb'.expandtabs(4) }}|{{ 'ab'.translate({97: 'xy'}) }}|{{ '{0:>{1}}'.format('c', '3') }}|"
        "{{ [[1], [2, 3]]|sum(start=[]) }}|{{ 3 * 4 }}|{{ {'a': [1]}|tojson(indent=1) }}|"
        "{{ 'ab cd'|wordwrap(2, wrapstring='/') }}"
    )
    tok = _tokenizer(tiny64, template)
    assert tok.apply_chat_template(MSG) == 'a   b|xyb|  c|[1, 2, 3]|12|{\n "a": [\n  1\n ]\n}|ab/cd'
