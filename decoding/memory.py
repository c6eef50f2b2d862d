"""Memory checks before large allocations: what the machine has available, and a clear refusal.

Every buffer of the engine whose size grows with a request (the KV cache with the batch and
``max_new_tokens``, the verification logits with ``max_draft``, ...) is estimated first, and
:func:`check_fits` raises ``MemoryError`` with the bytes it would need and the bytes available,
instead of letting the allocation succeed lazily and the kernel kill the process later.

Available memory is Linux's ``MemAvailable`` (``/proc/meminfo``: free memory plus what the page
cache can give back), lowered to a cgroup's limit when the process runs under one
(``memory.max`` less ``memory.current``, cgroup v2); elsewhere the free physical pages
(``os.sysconf``); where neither can be read, nothing is refused. ``DECODING_MEMORY_LIMIT``
(bytes) replaces the measurement, to run under a smaller budget than the machine's.

Examples
--------
>>> check_fits(1 << 20, "a 1 MiB buffer", available=1 << 30)
>>> check_fits(3 << 30, "the KV cache (4 sequences of 8192 slots)", available=1 << 30)
Traceback (most recent call last):
...
MemoryError: the KV cache (4 sequences of 8192 slots) would need 3.00 GiB (3221225472 bytes); ...
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["available_bytes", "check_fits", "format_bytes"]

_MEMINFO = Path("/proc/meminfo")
_CGROUP = Path("/sys/fs/cgroup")


def _meminfo_available(path: Path = _MEMINFO) -> int | None:
    try:
        for line in path.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                parts = line.split()
                return int(parts[1]) * (1024 if parts[2:3] == ["kB"] else 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_available(root: Path = _CGROUP) -> int | None:
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(int(limit) - int((root / "memory.current").read_text().strip()), 0)
    except (OSError, ValueError):
        return None


def _sysconf_available() -> int | None:
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def available_bytes() -> tuple[int | None, str]:
    """``(bytes the process can still allocate, where the figure comes from)``; None if unknown.

    Examples
    --------
    >>> n, source = available_bytes()
    >>> n is None or n >= 0, isinstance(source, str)
    (True, True)
    """
    env = os.environ.get("DECODING_MEMORY_LIMIT")
    if env:
        try:
            limit = int(env)
        except ValueError:
            limit = -1
        if limit < 0:  # a negative budget refused every buffer, saying "-5 bytes are available"
            raise ValueError(f"DECODING_MEMORY_LIMIT must be a number of bytes >= 0, got {env!r}")
        return limit, "DECODING_MEMORY_LIMIT"
    n, source = _meminfo_available(), "MemAvailable in /proc/meminfo"
    if n is None:
        n, source = _sysconf_available(), "free physical pages (os.sysconf)"
    group = _cgroup_available()
    if group is not None and (n is None or group < n):
        n, source = group, "the cgroup's memory.max less memory.current"
    return n, source


def format_bytes(n: int) -> str:
    """``n`` bytes in the largest binary unit that keeps it >= 1, two decimals.

    Examples
    --------
    >>> format_bytes(46080), format_bytes(21.5 * 2**30)
    ('45.00 KiB', '21.50 GiB')
    """
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} bytes"


def check_fits(nbytes: int, what: str, *, available: int | None = None, source: str = "") -> None:
    """Raise ``MemoryError`` when ``what`` (``nbytes`` bytes) exceeds the memory available.

    Parameters
    ----------
    nbytes : int
        The estimate of the allocation (or of several made together).
    what : str
        What it is, for the message (say which arguments set its size).
    available : int, optional
        Bytes available (default: :func:`available_bytes`).
    source : str
        Where ``available`` comes from, for the message.

    Examples
    --------
    >>> check_fits(10, "ten bytes", available=100)
    >>> check_fits(200, "a 200-byte buffer", available=100, source="a test")
    Traceback (most recent call last):
    ...
    MemoryError: a 200-byte buffer would need 200 bytes; 100 bytes are available (a test)
    """
    if available is None:
        available, source = available_bytes()
        if available is None:
            return
    if nbytes > available:
        where = f" ({source})" if source else ""
        raise MemoryError(f"{what} would need {_both(nbytes)}; {_both(available)} are available{where}")


def _both(n) -> str:
    return format_bytes(n) + (f" ({int(n)} bytes)" if abs(n) >= 1024 else "")
