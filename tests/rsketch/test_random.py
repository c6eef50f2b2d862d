"""Philox4x32-10: published known-answer vectors, the randomgen oracle, numba == portable path."""

import numpy as np
import pytest

from rsketch._random import (
    ZIG_X,
    bounded_exact,
    derive_key,
    key_from_seed,
    lane_words,
    philox4x32,
    random_words,
    sample_without_replacement,
    ziggurat_columns,
)
from rsketch.kernels import cpu

# Random123's kat_vectors for philox4x32_10: (counter, key, expected output).
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("ctr,key,expected", KAT)
def test_known_answer_vectors(ctr, key, expected):
    words = philox4x32(np, *(np.array([c], dtype=np.uint64) for c in ctr), key)
    assert tuple(int(w[0]) for w in words) == expected


@pytest.mark.parametrize("ctr,key,expected", KAT)
def test_numba_philox_known_answers(ctr, key, expected):
    from numba import njit

    @njit
    def one_block(c0, c1, c2, c3, k0, k1):
        return cpu.philox(c0, c1, c2, c3, k0, k1)

    u = np.uint64
    got = one_block(*(u(c) for c in ctr), u(key[0]), u(key[1]))
    assert tuple(int(w) for w in got) == expected


def test_matches_randomgen_oracle():
    randomgen = pytest.importorskip("randomgen", reason="randomgen is the oracle (pip install randomgen)")
    rng = np.random.default_rng(123)
    for _ in range(20):
        k0, k1 = (int(x) for x in rng.integers(0, 2**32, size=2))
        # Include counters that carry from word 0 into word 1.
        start = int(rng.integers(0, 2**33)) if rng.random() < 0.5 else 2**32 - 3
        m = 8
        bg = randomgen.Philox(key=k0 | (k1 << 32), counter=start - 1, number=4, width=32)
        expected = np.asarray(bg.random_raw(4 * m), dtype=np.uint64).reshape(m, 4)
        idx = np.arange(start, start + m, dtype=np.uint64)
        ours = philox4x32(np, idx & np.uint64(0xFFFFFFFF), idx >> np.uint64(32), 0, 0, (k0, k1))
        np.testing.assert_array_equal(np.stack(ours, axis=1), expected)
        fast = cpu.philox_words(k0, k1, start, m, 1, 0)[:, 0, :]
        np.testing.assert_array_equal(fast, expected)


def test_numba_words_equal_portable_words():
    key = (0xDEADBEEF, 0x01234567)
    fast = cpu.philox_words(key[0], key[1], 10, 50, 3, 7)
    idx = np.arange(10, 60)[:, None]
    blk = np.arange(3)[None, :]
    ref = np.stack(random_words(np, key, idx, blk, 7), axis=-1)
    np.testing.assert_array_equal(fast, ref)


def test_lane_words_are_the_words_in_order():
    key = (1, 2)
    w = lane_words(np, key, 0, 12, 5)
    blocks = np.stack(random_words(np, key, np.arange(3), 0, 5), axis=1).reshape(-1)
    np.testing.assert_array_equal(w, blocks)
    # Any sub-range is the same slice of the stream.
    np.testing.assert_array_equal(lane_words(np, key, 5, 11, 5), w[5:11])


def test_seed_forms():
    assert key_from_seed(7) == key_from_seed(7)
    assert key_from_seed(7) != key_from_seed(8)
    assert key_from_seed(np.random.SeedSequence(7)) == key_from_seed(7)
    g1, g2 = np.random.default_rng(3), np.random.default_rng(3)
    assert key_from_seed(g1) == key_from_seed(g2)
    assert key_from_seed(g1) != key_from_seed(np.random.default_rng(3))  # g1 advanced
    assert key_from_seed(None) != key_from_seed(None)
    assert derive_key((1, 2), 1) != derive_key((1, 2), 2)
    for bad in ("7", 1.5, [1, 2], True):
        with pytest.raises(TypeError, match="seed"):
            key_from_seed(bad)
    with pytest.raises(ValueError, match="seed"):
        key_from_seed(-1)


@pytest.mark.parametrize("m, r", [(1000, 100), (1000, 1000), (7, 1), (10**15, 300), (2**62, 5)])
def test_floyd_sample_is_a_sorted_subset_and_the_kernel_equals_the_portable_path(m, r):
    rows = cpu.floyd_sample(5, 6, m, r, 1)
    np.testing.assert_array_equal(rows, sample_without_replacement(np, (5, 6), m, r, 1))
    assert rows.dtype == np.int64 and len(np.unique(rows)) == r and (np.diff(rows) > 0).all()
    assert 0 <= rows.min() and rows.max() < m
    if r == m:
        np.testing.assert_array_equal(rows, np.arange(m))


@pytest.mark.parametrize("bound", [1, 2, 3, 1000, 2**32 + 1, 2**62 + 3, 2**63 - 1])
def test_bounded_exact_kernel_equals_portable_path(bound):
    v = cpu.uniform_indices(1, 2, 5000, bound, 4)
    np.testing.assert_array_equal(v, bounded_exact(np, (1, 2), np.arange(5000), bound, 4))
    assert v.min() >= 0 and v.max() < bound
    if bound > 2**40:  # the high bits are used: values spread over the whole range
        assert v.max() > bound // 2


def test_ziggurat_kernel_equals_portable_path_and_is_normal():
    key = (0x1234, 0x5678)
    r = 257
    G = np.empty((40, r))
    cpu.gaussian_columns(key[0], key[1], 3, 43, r, 3, G, ZIG_X)
    np.testing.assert_array_equal(G, ziggurat_columns(np, key, 3, 43, r))
    # Moments of 1e6 draws: mean, variance, fourth moment within 5 standard errors.
    big = np.empty((1000, 1000))
    cpu.gaussian_columns(9, 9, 0, 1000, 1000, 3, big, ZIG_X)
    z = big.ravel()
    n = z.size
    assert abs(z.mean()) < 5 / np.sqrt(n)
    assert abs(z.var() - 1) < 5 * np.sqrt(2 / n)
    assert abs(np.mean(z**4) - 3) < 5 * np.sqrt(96 / n)
    # Tail mass beyond the ziggurat's base R = 3.44 (drawn by the tail algorithm): 2 * Phi(-R).
    from scipy.stats import norm

    p_tail = 2 * norm.sf(3.442619855899)
    frac = np.mean(np.abs(z) > 3.442619855899)
    assert abs(frac - p_tail) < 5 * np.sqrt(p_tail / n)


def test_routines_spawn_after_the_children_a_seed_sequence_has_given():
    # The copy of a SeedSequence seed dropped n_children_spawned: a routine's first child was the
    # caller's own first child (its sketches could repeat the caller's), and the caller's object must
    # stay as it was (the same result each time it is passed)
    from rsketch._validation import seed_sequence

    ss = np.random.SeedSequence(7)
    taken = ss.spawn(3)
    first = seed_sequence(ss).spawn(1)[0]
    assert first.spawn_key == (3,) and all(first.spawn_key != t.spawn_key for t in taken)
    assert ss.n_children_spawned == 3 and seed_sequence(ss).spawn(1)[0].spawn_key == (3,)
