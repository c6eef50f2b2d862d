"""Thread control for the engine: numba's threads on the cores left free; BLAS as the process set it.

numba's OpenMP threads spin-wait at the end of every parallel region, so the decoding loops run
them through a :class:`ThreadPolicy`: as many threads as there are cores the other processes leave
free (``DECODING_THREADS`` fixes the count; ``docs/decoding.md``, "Threading"). The engine's
products are numba kernels on every path (quantized, float32, float64), so BLAS is left alone: its
thread count is one per process, and limiting it would change it for every other thread too.
``DECODING_BLAS_THREADS=N`` limits it while the engine runs, process-wide, for a user who asks.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

import numpy as np

_controller = None
# BLAS's limit is process-wide: calls that overlap share one, set by the first to enter and undone
# by the last to leave (threadpoolctl's nested limits undo in their own order, so a call that
# left first put back the count it found while another still ran, and the other then restored
# its "original" count, the limit).
_limit_lock = threading.Lock()
_limit_users = 0  # calls inside a limiting blas_threads(), all threads together
_limiter = None  # threadpoolctl's limiter of the first of them


def default_threads() -> int | None:
    """``DECODING_BLAS_THREADS`` (an integer; ``"default"`` or unset: None, BLAS left alone)."""
    v = os.environ.get("DECODING_BLAS_THREADS", "default").strip().lower()
    if v in ("", "default", "none"):
        return None
    if not v.isdigit() or int(v) < 1:
        raise ValueError(f"DECODING_BLAS_THREADS must be an integer >= 1 or 'default', got {v!r}")
    return int(v)


def blas_threads(n: int | None = -1):
    """Context manager limiting BLAS to ``n`` threads (default: :func:`default_threads`; None: no limit).

    The limit is process-wide, so calls that overlap (from several threads, or nested) share it:
    the first to enter sets it, and the last to leave restores the count found before the first;
    meanwhile the first one's ``n`` holds.

    Examples
    --------
    >>> with blas_threads(None):  # no limit: BLAS left as it is
    ...     pass
    """
    if n == -1:
        n = default_threads()
    if n is None:
        return contextlib.nullcontext()
    return _shared_limit(n)


@contextlib.contextmanager
def _shared_limit(n: int):
    global _controller, _limit_users, _limiter
    with _limit_lock:
        if _limit_users == 0:
            if _controller is None:  # threadpoolctl is imported (and scans the loaded BLAS) on first use
                from threadpoolctl import ThreadpoolController

                _controller = ThreadpoolController()
            _limiter = _controller.limit(limits=n, user_api="blas")
        _limit_users += 1
    try:
        yield
    finally:
        with _limit_lock:
            _limit_users -= 1
            if _limit_users == 0:
                _limiter.restore_original_limits()
                _limiter = None


# -- numba's threads ------------------------------------------------------------------------------
# numba's OpenMP threads spin-wait at the end of every parallel region; with another process on a
# core, the thread that shares it is descheduled while the other spins, and a decode step went from
# 24 ms to 480-1800 ms. The engine therefore decodes on as many threads as there are cores the
# other processes leave free (``docs/decoding.md``, "Threading"). numba's thread count is
# thread-local, so this choice changes nothing outside the calling thread.

#: Seconds between two looks at the machine's load (a look reads /proc/stat: about 20 us).
PROBE_INTERVAL = 0.25
#: A core counts as taken when the other processes used more than this fraction of one.
TAKEN = 0.5
#: A policy that starts within this many seconds of another's last look starts from its choice
#: (the prefill runs before a new policy's first look).
CARRY_OVER = 5.0

_last_choice: tuple[float, int] | None = None  # (perf_counter, threads) of the latest look, any thread


def _busy_jiffies() -> tuple[int, int] | None:
    """(busy, total) clock ticks of every CPU since boot, from /proc/stat; None where unreadable."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(v) < 4:
        return None
    idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
    total = sum(v[:8])  # guest time is already counted in user
    return total - idle, total


def engine_thread_setting() -> int | str:
    """``DECODING_THREADS``: ``"auto"`` (the default: follow the load) or a fixed thread count.

    Examples
    --------
    >>> engine_thread_setting() in ("auto",) or isinstance(engine_thread_setting(), int)
    True
    """
    v = os.environ.get("DECODING_THREADS", "auto").strip().lower()
    if v in ("", "auto"):
        return "auto"
    try:
        n = int(v)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"DECODING_THREADS must be 'auto' or an integer >= 1, got {v!r}")
    return n


class ThreadPolicy:
    """numba threads of the calling thread, chosen from the cores other processes leave free.

    :meth:`update` (called once per decoding step) looks at most every :data:`PROBE_INTERVAL`
    seconds at the CPU time the whole machine used (``/proc/stat``) less the CPU time of this
    process (its spinning threads included), and sets ``numba.set_num_threads`` to the cores
    left: ``max(1, min(cores, numba's threads) - cores taken)``, a core being taken when the
    others used more than :data:`TAKEN` of it. A policy created within :data:`CARRY_OVER`
    seconds of another's last look starts from that choice (the prefill comes before the first
    look). Only the calling thread's setting changes
    (numba's count is thread-local); :meth:`restore` puts back the one it found.

    Parameters
    ----------
    setting : "auto" or int, optional
        Default :func:`engine_thread_setting` (``DECODING_THREADS``). An integer fixes the count.

    Attributes
    ----------
    threads : int
        The count in use.
    history : list of (cores taken, threads)
        One entry per look at the load.

    Examples
    --------
    >>> p = ThreadPolicy(1)
    >>> p.update(), p.threads
    (1, 1)
    >>> p.restore()
    """

    def __init__(self, setting: int | str | None = None):
        import numba

        self._numba = numba
        self.setting = engine_thread_setting() if setting is None else setting
        if self.setting != "auto" and (not isinstance(self.setting, int) or self.setting < 1):
            raise ValueError(f"setting must be 'auto' or an integer >= 1, got {self.setting!r}")
        self._before = numba.get_num_threads()
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        self.most = max(1, min(cores, numba.config.NUMBA_NUM_THREADS))
        self.ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.history: list[tuple[float, int]] = []
        self._last = None
        if self.setting == "auto":
            self.threads = self._before
            self._last = self._look()
            last = _last_choice  # one read: another thread may replace it
            if self._last is not None and last is not None and time.perf_counter() - last[0] < CARRY_OVER:
                self.threads = min(last[1], self.most)
                numba.set_num_threads(self.threads)
        else:
            self.threads = min(int(self.setting), numba.config.NUMBA_NUM_THREADS)
            numba.set_num_threads(self.threads)

    def _look(self):
        j = _busy_jiffies()
        return None if j is None else (time.perf_counter(), time.process_time(), *j)

    def update(self) -> int:
        """The thread count for the next step (re-chosen when :data:`PROBE_INTERVAL` has passed)."""
        if self.setting != "auto" or self._last is None:
            return self.threads
        now = time.perf_counter()
        if now - self._last[0] < PROBE_INTERVAL:
            return self.threads
        cur = self._look()
        if cur is None:
            return self.threads
        wall, own = cur[0] - self._last[0], cur[1] - self._last[1]
        busy_all, total = cur[2] - self._last[2], cur[3] - self._last[3]
        self._last = cur
        if total <= 0:
            return self.threads
        # cores' worth of CPU the other processes used: all CPUs' busy share times the CPU count,
        # less this process's own CPU time over the same wall time
        ncpu = os.cpu_count() or 1
        others = max(0.0, busy_all / total * ncpu - own / max(wall, 1e-9))
        taken = int(np.floor(others + (1.0 - TAKEN)))
        threads = max(1, self.most - taken)
        self.history.append((round(others, 2), threads))
        global _last_choice
        _last_choice = (now, threads)
        if threads != self.threads:
            self._numba.set_num_threads(threads)
            self.threads = threads
        return threads

    def restore(self) -> None:
        """Put back the calling thread's numba thread count from before this policy."""
        self._numba.set_num_threads(self._before)


@contextlib.contextmanager
def engine_threads(setting: int | str | None = None):
    """A :class:`ThreadPolicy` for the calling thread, restored on exit.

    Examples
    --------
    >>> with engine_threads(1) as policy:
    ...     policy.update()
    1
    """
    policy = ThreadPolicy(setting)
    try:
        yield policy
    finally:
        policy.restore()
