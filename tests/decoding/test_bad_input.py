"""Clear errors that name the argument at fault (issue 17, item 6: the decoding cases)."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from decoding import cli, generate


@pytest.mark.parametrize(
    ("prompts", "kwargs", "exc", "match"),
    [
        ("hi \ud800", {}, ValueError, r"^prompts\[0\] is not valid text: character 3 .*U\+D800"),
        (["ok", "a\udcff"], {}, ValueError, r"^prompts\[1\] is not valid UTF-8: .*byte 0xff"),
        ("ok", {"stop": 5}, TypeError, r"^stop must be a string, a list of strings or None, got int"),
        ("ok", {"stop": ["a", 3]}, TypeError, r"^stop\[1\] must be a string"),
        ("ok", {"stop": ["a", ""]}, ValueError, r"^stop\[1\] is empty"),
        ("ok", {"seed": "abc"}, TypeError, r"^seed must be None, a non-negative int"),
        ("ok", {"seed": -1}, ValueError, r"^seed must be a non-negative integer, got -1"),
        ("ok", {"seed": 1.5}, TypeError, r"^seed must be"),
        ("ok", {"seed": True}, TypeError, r"^seed must be"),
        ([[1.9, 2.7]], {}, TypeError, r"^prompts\[0\]\[0\] must be an integer token id, got float 1.9"),
        ([["1", "2"]], {}, TypeError, r"^prompts\[0\]\[0\] must be an integer token id, got str"),
        ([[1, True]], {}, TypeError, r"^prompts\[0\]\[1\] must be an integer token id, got bool"),
        ([[1, np.float64(2)]], {}, TypeError, r"^prompts\[0\]\[1\]"),
        (
            [np.array([1.0, 2.0])],
            {},
            TypeError,
            r"^prompts\[0\] must hold integer token ids, got dtype float64",
        ),
        (
            [np.array([True, False])],
            {},
            TypeError,
            r"^prompts\[0\] must hold integer token ids, got dtype bool",
        ),
        ([np.array([[1, 2]])], {}, TypeError, r"^prompts\[0\] must be a 1-D array"),
        ([[1, 99999]], {}, ValueError, r"^prompts\[0\] has token ids outside \[0, 264\): 99999 at index 1"),
        ([[1, -1]], {}, ValueError, r"^prompts\[0\] has token ids outside"),
        ("ok", {"method": "ems", "references": [[1.5]]}, TypeError, r"^references\[0\]\[0\]"),
        ("ok", {"method": "ems", "references": ["\ud800"]}, ValueError, r"^references\[0\] is not valid"),
        (
            "ok",
            {"method": "ems", "references": [[1, 2, 70000, 70000]], "draft_budget": None},
            ValueError,
            r"^references\[0\] has token ids outside \[0, 264\): 70000 at index 2",
        ),
        (
            ["a", "b"],
            {"method": "vanilla", "references": [[1], np.array([3, -1])], "draft_budget": None},
            ValueError,
            r"^references\[1\] has token ids outside \[0, 264\): -1 at index 1",
        ),
        ("ok", {"method": "ems", "max_draft": 0}, ValueError, r"^max_draft must be >= 1, got 0$"),
        (
            "ok",
            {"method": "vanilla", "max_draft": np.int64(0)},
            ValueError,
            r"^max_draft must be >= 1, got 0$",
        ),
    ],
)
def test_generate_names_the_bad_argument(tiny64, prompts, kwargs, exc, match):
    model, tok = tiny64
    with pytest.raises(exc, match=match):
        generate(model, tok, prompts, max_new_tokens=2, **kwargs)


@pytest.mark.parametrize("method", ["autoregressive", "ems"])
@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        (
            {"drafter": "foo"},
            ValueError,
            r"^drafter must be 'llma', 'prompt_lookup', 'draft_model' or a Drafter",
        ),
        ({"drafter": 5}, TypeError, r"^drafter must be a drafter's name or a Drafter object, got int"),
        ({"max_draft": -5}, ValueError, r"^max_draft must be >= 1, got -5"),
        ({"max_draft": 2.5}, TypeError, r"^max_draft must be an integer, got float"),
        ({"draft_budget": "bogus"}, ValueError, r"^draft_budget must be 'auto', None, .*got 'bogus'"),
        ({"draft_budget": 3}, TypeError, r"^draft_budget must be 'auto', None, .*got int"),
        (
            {"references": ["a", "b"]},
            ValueError,
            r"^references must be a list with one entry per prompt \(1\)",
        ),
        ({"references": [[1, 70000]]}, ValueError, r"^references\[0\] has token ids outside"),
        ({"references": [None]}, TypeError, r"^references\[0\] must be a str or a list of token ids"),
    ],
)
def test_speculative_options_are_checked_whatever_the_method(tiny64, method, kwargs, exc, match):
    # with the default method="autoregressive" they went unchecked (and unused)
    model, tok = tiny64
    with pytest.raises(exc, match=match):
        generate(model, tok, "the cat", max_new_tokens=2, method=method, **kwargs)


def test_valid_speculative_options_are_ignored_by_autoregressive_decoding(tiny64):
    from decoding.drafters import PromptLookupDrafter

    model, tok = tiny64
    ref = generate(model, tok, ["the cat", "a hat"], max_new_tokens=4)
    for kw in (
        {"drafter": "draft_model", "max_draft": np.int64(2), "draft_budget": None},
        {"drafter": PromptLookupDrafter(copy_len=3), "references": ["the cat sat", [1, 2, 3]]},
    ):
        res = generate(model, tok, ["the cat", "a hat"], max_new_tokens=4, **kw)
        assert res.tokens == ref.tokens and res.method == "autoregressive"


@pytest.mark.parametrize("max_new_tokens", [np.int16(32767), np.int32(2**31 - 1), np.int64(2**63 - 1)])
def test_a_numpy_max_new_tokens_does_not_overflow_the_context_check(tiny64, max_new_tokens):
    # len(prompt) + max_new_tokens wrapped around in the NumPy type: a warning, or no error at all
    model, tok = tiny64
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(
            ValueError, match=rf"^prompts\[0\] has 2 tokens; with max_new_tokens={max_new_tokens} "
        ):
            generate(model, tok, [[1, 2]], max_new_tokens=max_new_tokens)
    assert len(generate(model, tok, [[1, 2]], max_new_tokens=np.int16(3)).tokens[0]) <= 3


@pytest.mark.parametrize("tokenizer", [None, "tok", object()])
def test_generate_needs_a_tokenizer(tiny64, tokenizer):
    with pytest.raises(
        TypeError, match=r"^tokenizer must be a decoding.Tokenizer .*got (NoneType|str|object)"
    ):
        generate(tiny64.model, tokenizer, "ok", max_new_tokens=2)


def test_integer_ids_and_seeds_that_are_fine(tiny64):
    model, tok = tiny64
    ids = tok.encode("the cat")
    ref = generate(model, tok, [ids], max_new_tokens=3).tokens
    for p in (np.array(ids, dtype=np.int32), np.array(ids, dtype=np.uint16), [np.int64(t) for t in ids]):
        assert generate(model, tok, [p], max_new_tokens=3).tokens == ref
    kw = dict(max_new_tokens=4, temperature=1.0)
    a = generate(model, tok, "the", seed=7, **kw).tokens
    assert generate(model, tok, "the", seed=np.int64(7), **kw).tokens == a
    assert generate(model, tok, "the", seed=np.random.SeedSequence(7), **kw).tokens == a
    # a Generator gives a key drawn from it (as rsketch's seeds do): the same state, the same tokens
    b = generate(model, tok, "the", seed=np.random.default_rng(7), **kw).tokens
    assert generate(model, tok, "the", seed=np.random.default_rng(7), **kw).tokens == b


def test_tokenizer_encode_names_its_argument(tiny64):
    tok = tiny64.tokenizer
    with pytest.raises(ValueError, match=r"^text is not valid text: character 3 is a lone surrogate U\+D800"):
        tok.encode("hi \ud800")
    with pytest.raises(TypeError, match="^text must be a str, got NoneType"):
        tok.encode(None)


@pytest.mark.parametrize("dtype", [None, 5, float, "float32", np.int32, np.float16, np.dtype(">f8")])
def test_load_model_takes_only_the_documented_dtypes(tiny_path, dtype):
    # None loaded float64, 5 raised numpy's "Cannot interpret '5' as a data type", float was float64
    from decoding import Model, load_model

    match = r"^dtype must be 'quantized', numpy.float32 or numpy.float64, got "
    with pytest.raises(ValueError, match=match):
        load_model(tiny_path[0], dtype=dtype)
    with pytest.raises(ValueError, match=match):
        Model.from_gguf(tiny_path[0], dtype=dtype)


def test_load_model_dtypes_that_are_fine(tiny_path):
    from decoding import load_model

    for dtype, want in (
        (np.float32, np.float32),
        (np.dtype(np.float64), np.float64),
        ("quantized", np.float32),
    ):
        assert load_model(tiny_path[0], dtype=dtype).model.dtype == want


# -- the command line ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("prompt", "match"),
    [
        ("hi \ud800", r"^error: the prompt is not valid text: character 3 is a lone surrogate U\+D800"),
        (
            "hi \udcff",
            r"^error: the prompt is not valid UTF-8: character 3 is U\+DCFF, the undecodable byte 0xff",
        ),
    ],
)
def test_cli_bad_text(tiny_path, capsys, monkeypatch, prompt, match):
    loaded = []
    monkeypatch.setattr(cli, "load_model", lambda name: loaded.append(name))
    assert cli.main(["generate", prompt, "--model", str(tiny_path[0])]) == 2
    assert capsys.readouterr().err.startswith("error:")
    assert loaded == []  # refused before the model is loaded
    assert cli.main(["generate", prompt, "--model", str(tiny_path[0]), "--chat"]) == 2
    assert re.match(match, capsys.readouterr().err)


def test_cli_invalid_utf8_argument(tiny_path):
    """Raw bytes that are not UTF-8 on the command line, as a shell passes them."""
    proc = subprocess.run(
        [sys.executable, "-m", "decoding", "generate", b"hi \xff\xfe", "--model", str(tiny_path[0])],
        capture_output=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
        env={"PYTHONIOENCODING": "utf-8", "LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin"},
    )
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, err
    assert "error: the prompt is not valid UTF-8: character 3 is U+DCFF, the undecodable byte 0xff" in err
    assert "Traceback" not in err and "TextInputSequence" not in err


def test_cli_reference_not_utf8(tiny_path, tmp_path, capsys):
    ref = tmp_path / "ref.bin"
    ref.write_bytes(b"the cat \xff sat")
    args = ["generate", "the cat", "--model", str(tiny_path[0]), "--method", "ems", "--reference", str(ref)]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert f"--reference {ref}: not valid UTF-8 (byte 0xff at offset 8)" in err


def test_cli_reference_that_cannot_be_opened_is_named(tiny_path, tmp_path, capsys):
    # "error: [Errno 21] Is a directory: '/tmp'" had named no option (a probe, 2026-12-07)
    for ref, why in ((tmp_path, "Is a directory"), (tmp_path / "missing.txt", "No such file")):
        args = [
            "generate",
            "the cat",
            "--model",
            str(tiny_path[0]),
            "--method",
            "ems",
            "--reference",
            str(ref),
        ]
        assert cli.main(args) == 2
        assert f"--reference {ref}: {why}" in capsys.readouterr().err


def test_cli_reads_a_bounded_reference_and_encodes_it_once(tiny_path, tmp_path, capsys, monkeypatch):
    # /dev/zero had been read to 5 GB (then "error: " with no message), and a reference was encoded
    # once per sample of --batch (a 9 MB file at batch 8: 59 s)
    ref = tmp_path / "ref.txt"
    ref.write_text("the cat sat on the mat " * 20)
    monkeypatch.setattr(cli, "MAX_REFERENCE_CHARS", 100)
    args = ["generate", "the cat", "--model", str(tiny_path[0]), "--method", "ems", "--reference", str(ref)]
    assert cli.main(args) == 2
    assert f"--reference {ref}: longer than 100 characters" in capsys.readouterr().err
    monkeypatch.setattr(cli, "MAX_REFERENCE_CHARS", 10_000)
    from decoding.tokenizer import Tokenizer

    encoded = []
    encode = Tokenizer.encode
    monkeypatch.setattr(
        Tokenizer, "encode", lambda self, text, **kw: encoded.append(text) or encode(self, text, **kw)
    )
    assert cli.main([*args, "--batch", "4", "--max-new-tokens", "3"]) == 0
    assert encoded.count(ref.read_text()) == 1


def test_unused_references_and_oversized_prompts_are_not_encoded(tiny64, monkeypatch):
    model, tok = tiny64
    encoded = []
    encode = type(tok).encode
    monkeypatch.setattr(
        type(tok), "encode", lambda self, text, **kw: encoded.append(len(text)) or encode(self, text, **kw)
    )
    big = "the cat " * 50_000  # 400,000 bytes
    generate(model, tok, ["the cat"], max_new_tokens=2, references=[big])  # autoregressive reads none
    assert max(encoded) < 100
    ctx = model.config.context_length
    with pytest.raises(
        ValueError, match=rf"prompts\[0\] is 400,000 bytes, .* context of {ctx} tokens \(refused before"
    ):
        generate(model, tok, [big], max_new_tokens=2)
    assert max(encoded) < 100


@pytest.mark.parametrize("method", [[], ["--method", "ems"], ["--method", "vanilla"]])
def test_cli_max_draft_zero(tiny_path, capsys, monkeypatch, method):
    loaded = []
    monkeypatch.setattr(cli, "load_model", lambda name: loaded.append(name))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["generate", "the", "--model", str(tiny_path[0]), "--max-draft", "0", *method])
    assert exit_info.value.code == 2
    assert "error: --max-draft must be >= 1, got 0" in capsys.readouterr().err
    assert loaded == []  # refused before the model is loaded


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-batch", "0"], "error: --max-batch: max_batch must be >= 1"),
        (["--max-batch", "-1"], "error: --max-batch: max_batch must be >= 1"),
        (
            ["--batch", "2", "--max-batch", "1", "--method", "vanilla"],
            "error: --max-batch: max_batch=1 < 2 prompts needs method",
        ),
    ],
)
def test_cli_max_batch_is_checked_before_the_load(tiny_path, capsys, monkeypatch, flags, message):
    # refused after the model's load and the warm-up generate, as "max_batch must be >= 1"
    loaded = []
    monkeypatch.setattr(cli, "load_model", lambda name: loaded.append(name))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["generate", "the", "--model", str(tiny_path[0]), *flags])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err and loaded == []


def test_cli_names_the_flag_at_fault_before_loading_or_allocating(tiny_path, capsys, monkeypatch):
    # --max-new-tokens past the context was reported as "--batch 1 ... would need 2095.48 TiB"
    args = ["generate", "the", "--model", str(tiny_path[0]), "--max-new-tokens", str(10**11)]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "error: --max-new-tokens 100000000000: with the prompt's" in err and "context" in err
    # a --reference that cannot be read is an error whatever --method (it was never opened)
    args = ["generate", "the", "--model", str(tiny_path[0]), "--reference", "/no/such/file"]
    assert cli.main(args) == 2
    assert "No such file" in capsys.readouterr().err
    loaded = []
    monkeypatch.setattr(cli, "load_model", lambda name: loaded.append(name))
    for argv in (["demo", "--max-new-tokens", "0"], ["generate", "x", "--max-new-tokens", "-5"]):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert f"usage: python -m decoding {argv[0]}" in err and "--max-new-tokens must be >= 1" in err
    assert loaded == []


def test_cli_speed_line_follows_a_warm_up_call(tiny_path, capsys, monkeypatch):
    # the first call loads the compiled kernels: its prefill had been reported (0.6 tok/s for 740)
    calls = []

    def spy(*args, **kw):
        calls.append(kw["max_new_tokens"])
        return generate(*args, **kw)

    monkeypatch.setattr(cli, "generate", spy)
    assert cli.main(["generate", "the", "--model", str(tiny_path[0]), "--max-new-tokens", "3"]) == 0
    assert calls == [1, 3]
    capsys.readouterr()
    # a bad sampling value or seed is refused before the warm-up (which would cost it a prefill)
    for bad in (["--temperature", "-1"], ["--top-p", "2"], ["--temperature", "1", "--seed", "-1"]):
        calls.clear()
        assert cli.main(["generate", "the", "--model", str(tiny_path[0]), *bad]) == 2
        assert calls == [] and "error:" in capsys.readouterr().err


def test_cli_bad_seed(tiny_path, capsys):
    args = ["generate", "the", "--model", str(tiny_path[0]), "--temperature", "1", "--seed", "-1"]
    assert cli.main(args) == 2
    assert "error: seed must be a non-negative integer, got -1" in capsys.readouterr().err
