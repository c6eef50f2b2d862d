"""Progress bars that cost nothing when they are off."""

from __future__ import annotations

from tqdm.auto import tqdm


class _NoBar:
    """A progress bar's calls, doing nothing."""

    def update(self, n=1):
        pass

    def set_postfix_str(self, s=""):
        pass

    def close(self):
        pass


def progress_bar(total: int, *, enabled: bool, **kwargs):
    """A ``tqdm`` bar over ``total`` steps where ``enabled``, else an object that ignores the same calls.

    No ``tqdm`` at all when off: even disabled, ``tqdm`` starts its monitor thread, which then lives as
    long as the process (``efficiency(progress=False)`` had left one behind).

    Examples
    --------
    >>> bar = progress_bar(3, enabled=False)
    >>> bar.update(1); bar.close()
    """
    return tqdm(total=total, **kwargs) if enabled else _NoBar()
