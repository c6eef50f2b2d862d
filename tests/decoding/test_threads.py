"""The engine's numba thread policy (decoding._threads.ThreadPolicy) with the load injected."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import threading
from pathlib import Path

import numba
import numpy as np
import pytest

from decoding import _threads
from decoding._threads import ThreadPolicy, engine_thread_setting, engine_threads
from tests.blas_watch import blas_thread_counts, watching_blas_threads


class FakeMachine:
    """Scripted /proc/stat and clocks: ``run(wall, own, others)`` advances them by ``wall`` seconds
    during which this process used ``own`` cores and the other processes ``others``."""

    def __init__(self, ncpu):
        self.ncpu, self.wall, self.cpu, self.busy, self.total = ncpu, 100.0, 0.0, 0, 0

    def perf_counter(self):
        return self.wall

    def process_time(self):
        return self.cpu

    def jiffies(self):
        return self.busy, self.total

    def run(self, wall, own, others):
        self.wall += wall
        self.cpu += own * wall
        self.busy += round((own + others) * wall * 100)
        self.total += round(self.ncpu * wall * 100)


@pytest.fixture
def machine(monkeypatch):
    m = FakeMachine(ncpu=2)
    monkeypatch.setattr(_threads, "time", m)
    monkeypatch.setattr(_threads, "_busy_jiffies", m.jiffies)
    monkeypatch.setattr(_threads, "_last_choice", None)  # fake times stay out of later policies
    monkeypatch.setattr(_threads.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(_threads.os, "sched_getaffinity", lambda pid: {0, 1})
    return m


def test_one_thread_while_another_process_takes_a_core(machine):
    before = numba.get_num_threads()
    most = min(2, numba.config.NUMBA_NUM_THREADS)
    with engine_threads("auto") as p:
        machine.run(0.5, own=2.0, others=0.0)  # idle machine: both cores
        assert p.update() == most
        machine.run(0.5, own=1.0, others=1.0)  # a busy loop beside ours (our spinners get one core)
        assert p.update() == 1 and numba.get_num_threads() == 1
        machine.run(0.1, own=1.0, others=0.0)  # looked again too soon: unchanged
        assert p.update() == 1
        machine.run(0.5, own=1.0, others=0.2)  # the other process is gone (0.2 of a core: not taken)
        assert p.update() == most and numba.get_num_threads() == most
        assert [t for _, t in p.history] == [most, 1, most]
    assert numba.get_num_threads() == before


def test_fixed_setting_and_env(monkeypatch):
    with engine_threads(1) as p:
        assert p.update() == 1 and numba.get_num_threads() == 1
    monkeypatch.setenv("DECODING_THREADS", "1")
    assert engine_thread_setting() == 1
    monkeypatch.setenv("DECODING_THREADS", "0")
    with pytest.raises(ValueError, match="DECODING_THREADS"):
        engine_thread_setting()
    with pytest.raises(ValueError, match="setting"):
        ThreadPolicy("many")


def test_only_the_calling_thread_changes():
    """numba's count is thread-local: a policy in a worker thread leaves the main thread's alone."""
    before = numba.get_num_threads()
    seen = []

    def worker():
        with engine_threads(1):
            seen.append(numba.get_num_threads())

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == [1] and numba.get_num_threads() == before


def test_no_proc_stat_keeps_numbas_count(monkeypatch):
    monkeypatch.setattr(_threads, "_busy_jiffies", lambda: None)
    with engine_threads("auto") as p:
        assert p.update() == numba.get_num_threads()
        assert p.history == []


def test_generate_under_the_policy_gives_the_same_tokens(tiny64, monkeypatch):
    from decoding import generate

    model, tok = tiny64
    ids = [[1, 2, 3, 4], [5, 6]]
    monkeypatch.setenv("DECODING_THREADS", "1")
    one = generate(model, tok, ids, max_new_tokens=6, seed=0).tokens
    monkeypatch.setenv("DECODING_THREADS", "auto")
    auto = generate(model, tok, ids, max_new_tokens=6, seed=0).tokens
    assert one == auto and np.array(one).shape == (2, 6)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs numba threads to choose from")
@pytest.mark.parametrize("method", ["autoregressive", "ems", "vanilla"])
def test_every_forward_of_a_call_runs_under_the_policy(tiny64, monkeypatch, method):
    """The prefill too: EMS-SD and vanilla prefilled before the policy took over, on numba's count
    at entry (beside a busy neighbour, two threads took 2.1 s where one took 0.09 s)."""
    from decoding import generate

    model, tok = tiny64
    seen = []
    forward = type(model).forward

    def spy(self, *args, **kwargs):
        seen.append(numba.get_num_threads())
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward", spy)
    monkeypatch.setenv("DECODING_THREADS", "1")
    kw = {} if method == "autoregressive" else {"method": method, "drafter": "llma", "draft_budget": None}
    generate(model, tok, [[1, 2, 3, 4, 1, 2], [5, 6]], max_new_tokens=5, seed=0, **kw)
    assert numba.get_num_threads() > 1  # the caller's count, restored
    assert len(seen) >= 2 and set(seen) == {1}


def test_the_engine_leaves_the_blas_thread_count_as_found(tiny64, tiny_path, monkeypatch):
    # BLAS has one thread count per process: loading and generating must not change it while they
    # run (another thread watches), unless DECODING_BLAS_THREADS asks for a limit.
    from decoding import generate, load_model

    model, tok = tiny64
    monkeypatch.delenv("DECODING_BLAS_THREADS", raising=False)
    before = blas_thread_counts()
    with watching_blas_threads() as seen:
        load_model(tiny_path[0], dtype=np.float64)
        for method in ("autoregressive", "ems", "vanilla"):
            generate(model, tok, [[1, 2, 3, 4], [5, 6]], max_new_tokens=6, seed=0, method=method)
    assert seen and all(s == before for s in seen)
    if max(before) > 1:  # the opt-in limit holds while the engine runs, and is undone after
        monkeypatch.setenv("DECODING_BLAS_THREADS", "1")
        with _threads.blas_threads():
            assert blas_thread_counts() == [1] * len(before)
        assert blas_thread_counts() == before


# Run in a fresh interpreter, every BLAS call from worker threads: this process's OpenBLAS ignores a
# worker thread's openblas_set_num_threads once the main thread has called it (as the test above
# does), so the limit could not be observed here.
OVERLAP = """
import sys, threading
import numpy as np
from decoding import api, generate, load_model
from tests.blas_watch import blas_thread_counts

seen, errors, loaded = {}, [], []
a_in, b_in, a_done = threading.Event(), threading.Event(), threading.Event()
real = api.autoregressive_generate

def choreographed(model, tokenizer, **kw):  # runs inside generate's blas_threads()
    if threading.current_thread().name == "A":
        a_in.set()
        assert b_in.wait(60)
    else:
        b_in.set()
        assert a_done.wait(60)
        seen["B after A"] = blas_thread_counts()
    return real(model, tokenizer, **kw)

def run(n):
    try:
        if n is None:
            loaded.extend(load_model(sys.argv[1], dtype=np.float64))
        else:
            generate(*loaded, [[1, 2, 3]], max_new_tokens=n)
    except BaseException as e:
        errors.append(repr(e))
    finally:
        if n == 10:
            a_done.set()

t = threading.Thread(target=run, args=(None,))
t.start(); t.join()
seen["before"] = blas_thread_counts()
api.autoregressive_generate = choreographed
a = threading.Thread(target=run, args=(10,), name="A")
b = threading.Thread(target=run, args=(40,), name="B")
a.start()
a_in.wait(60)
b.start()
a.join(); b.join()
seen["after"] = blas_thread_counts()
print(repr((seen, errors)))
"""


def test_overlapping_calls_restore_the_blas_thread_count(tiny_path, monkeypatch):
    """Thread A generates, B starts while A runs, A finishes first: the opt-in limit holds until B
    finishes, and then the count from before both is back (OpenBLAS stayed at 1 thread for good)."""
    monkeypatch.setenv("DECODING_BLAS_THREADS", "1")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", OVERLAP, str(tiny_path[0])],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr
    seen, errors = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    assert errors == []
    if max(seen["before"], default=1) == 1:
        pytest.skip("BLAS runs on one thread here: a limit of 1 changes nothing")
    assert seen["B after A"] == [1] * len(seen["before"])  # the limit holds while B runs
    assert seen["after"] == seen["before"]  # and is undone when the last call leaves


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_blas_thread_setting_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("DECODING_BLAS_THREADS", value)
    with pytest.raises(ValueError, match="DECODING_BLAS_THREADS must be an integer >= 1"):
        _threads.default_threads()


def test_a_new_policy_starts_from_a_recent_choice(machine, monkeypatch):
    before = numba.get_num_threads()
    with engine_threads("auto") as p:
        machine.run(0.5, own=1.0, others=1.0)
        assert p.update() == 1
    assert numba.get_num_threads() == before
    machine.run(1.0, own=0.0, others=1.0)
    with engine_threads("auto") as p:  # 1 s later: the prefill already runs on one thread
        assert p.threads == 1 and numba.get_num_threads() == 1
    machine.run(_threads.CARRY_OVER + 1, own=0.0, others=1.0)
    with engine_threads("auto") as p:  # too old: numba's count at entry
        assert p.threads == before


WORKQUEUE = r"""
import sys, threading
from decoding import generate, load_model
loaded = load_model(sys.argv[1])
ref = generate(*loaded, [[1, 2, 3, 4]] * 3, max_new_tokens=12).tokens
errors, outs = [], []
def run():
    try:
        for _ in range(3):
            outs.append(generate(*loaded, [[1, 2, 3, 4]] * 3, max_new_tokens=12).tokens)
    except BaseException as e:
        errors.append(repr(e))
threads = [threading.Thread(target=run) for _ in range(4)]
[t.start() for t in threads]; [t.join() for t in threads]
import numba
print(repr((numba.threading_layer(), errors, all(o == ref for o in outs))))
"""


def test_concurrent_generate_under_numbas_workqueue_layer(tiny_path):
    """numba's workqueue layer (its fallback where OpenMP and TBB are missing) aborted the process
    when two threads' forwards launched kernels at once; a forward now holds one lock under it."""
    env = dict(os.environ, NUMBA_THREADING_LAYER="workqueue")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", WORKQUEUE, str(tiny_path[0])],
        capture_output=True, text=True, timeout=300, cwd=root, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ast.literal_eval(proc.stdout.strip().splitlines()[-1]) == ("workqueue", [], True)
