"""BLAS has one thread count per process: a library call must leave it as it found it, even while it
runs. :func:`watching_blas_threads` records the count from another thread while its block runs."""

from __future__ import annotations

import contextlib
import threading
import time

from threadpoolctl import threadpool_info


def blas_thread_counts() -> list[int]:
    """The thread count of every BLAS library loaded in this process."""
    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


@contextlib.contextmanager
def watching_blas_threads():
    """Yield a list that another thread fills with :func:`blas_thread_counts` every 2 ms meanwhile."""
    seen, done = [], threading.Event()

    def watch():
        while not done.is_set():
            seen.append(blas_thread_counts())
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join()
