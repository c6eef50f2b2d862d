"""Hot loops, one module per backend with the same function names (``cpu`` is numba)."""
