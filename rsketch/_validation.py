"""Argument and array checks, in one place; every message names the argument at fault."""

from __future__ import annotations

import numbers
import os

import numpy as np
import scipy.sparse as sp

from rsketch._backend import array_library, array_namespace

_SPARSE_OK = ("csr", "csc", "coo")


def shown_int(value: int) -> str:
    """An integer for a message: in full up to 20 digits, else by its size (Python refuses to print
    an int of over 4,300 digits: the message itself raised ``ValueError: Exceeds the limit``).

    Examples
    --------
    >>> shown_int(-12), shown_int(-10**5000)
    ('-12', '-(an integer of 16610 bits)')
    """
    if abs(value) < 10**20:
        return str(value)
    return f"{'-' if value < 0 else ''}(an integer of {abs(value).bit_length()} bits)"


def check_integers(a, name: str) -> None:
    """``TypeError`` unless the array-like ``a`` holds integers (an empty one of any dtype passes): an
    int64 cast would silently make 1.7 into 1.

    Examples
    --------
    >>> check_integers([1, 2], "ids"); check_integers([], "ids")
    >>> check_integers([1.7], "ids")
    Traceback (most recent call last):
    ...
    TypeError: ids must be integers, got dtype float64
    """
    dtype = np.asarray(a).dtype
    if np.size(a) and dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, got dtype {dtype}")


def check_int(value, name: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return ``value`` as an int after checking its type and range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {shown_int(value)}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {shown_int(value)}")
    return value


def check_bool(value, name: str) -> bool:
    """``value`` as a bool: a bool (NumPy's too) or the integer 0 or 1; ``TypeError`` otherwise (a
    string ``"no"`` had counted as True).

    Examples
    --------
    >>> check_bool(0, "error_probes"), check_bool(np.True_, "flip_sign")
    (False, True)
    >>> check_bool("no", "flip_sign")
    Traceback (most recent call last):
    ...
    TypeError: flip_sign must be True or False, got str 'no'
    """
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, numbers.Integral) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")


def check_float_dtype(dtype, name: str = "dtype") -> np.dtype:
    """Accept float32 or float64 (anything ``np.dtype`` understands as one of them)."""
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"{name} must be numpy.float32 or numpy.float64, got {dtype!r}") from exc
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"{name} must be numpy.float32 or numpy.float64, got {dt}")
    return dt


def _float_dtype_for(dtype: np.dtype, name: str) -> np.dtype:
    kind = dtype.kind
    if kind == "f":
        # float16 and extended precision have no kernels: compute in the nearest supported width.
        return np.dtype(np.float32) if dtype.itemsize <= 4 else np.dtype(np.float64)
    if kind in "iub":
        return np.dtype(np.float64)
    if kind == "c":
        raise TypeError(f"{name} must be real-valued; got complex dtype {dtype}")
    raise TypeError(f"{name} must be a numeric (real) array; got dtype {dtype}")


#: Entries per block of :func:`_all_finite`'s exact check (its boolean mask: 1 MB).
FINITE_BLOCK = 1 << 20


def _all_finite(data: np.ndarray) -> bool:
    """Whether ``data`` holds no NaN or infinity, with no array of ``data``'s size allocated.

    A finite sum proves it (NaN and infinity reach any sum that adds them); a sum that is not
    finite (those, or finite values whose sum overflows) is settled exactly, a block of rows at a
    time. ``np.isfinite(data).all()`` had allocated a boolean mask of ``data``'s size: ``n k``
    bytes for the sampling sketches, whose own memory is ``O(r)``.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(data.sum()):
            return True
    if data.ndim == 0:
        return bool(np.isfinite(data))
    rows = max(1, FINITE_BLOCK // max(1, data[:1].size))
    return all(bool(np.isfinite(data[a : a + rows]).all()) for a in range(0, data.shape[0], rows))


def check_finite(A, name: str = "A") -> None:
    """Raise ``ValueError`` if a dense or sparse array holds NaN or infinity (in memory: no array
    of ``A``'s size allocated, :func:`_all_finite`).

    Examples
    --------
    >>> check_finite(np.ones((3, 2)))
    >>> check_finite(np.array([1.0, np.nan]), "y")
    Traceback (most recent call last):
    ...
    ValueError: y contains NaN or infinite values
    """
    data = A
    if sp.issparse(A):  # a compressed matrix's storage past indptr[-1] is spare (SciPy allows it)
        data = A.data[: int(A.indptr[-1])] if hasattr(A, "indptr") else A.data
    if isinstance(data, np.ndarray):
        ok = _all_finite(data)
    else:
        xp = array_namespace(data)
        ok = bool(xp.all(xp.isfinite(data)))
    if not ok:
        raise ValueError(f"{name} contains NaN or infinite values")


def _float_dtype_for_namespace(A, name: str) -> np.dtype:
    xp = array_namespace(A)
    if xp.isdtype(A.dtype, "real floating"):
        return np.dtype(np.float32) if A.dtype == xp.float32 else np.dtype(np.float64)
    if xp.isdtype(A.dtype, "integral") or xp.isdtype(A.dtype, "bool"):
        return np.dtype(np.float64)
    if xp.isdtype(A.dtype, "complex floating"):
        raise TypeError(f"{name} must be real-valued; got complex dtype {A.dtype}")
    raise TypeError(f"{name} must be a numeric (real) array; got dtype {A.dtype}")


def plain_ndarray(A, name: str) -> np.ndarray:
    """An ndarray subclass as a base-class ndarray; a masked array with masked entries is refused.

    The kernels use ``*`` as elementwise product, which ``np.matrix`` makes a matrix product;
    a mask would be ignored, silently reading the values it hides.

    Examples
    --------
    >>> type(plain_ndarray(np.ma.masked_array([[1.0], [2.0]]), "A")).__name__  # nothing masked
    'ndarray'
    >>> plain_ndarray(np.ma.masked_array([1.0, 2.0], mask=[0, 1]), "A")
    Traceback (most recent call last):
    ...
    TypeError: A is a masked array with masked entries, which rsketch cannot honour: pass A.filled(value)...
    """
    if isinstance(A, np.ma.MaskedArray):
        if np.ma.getmaskarray(A).any():
            raise TypeError(
                f"{name} is a masked array with masked entries, which rsketch cannot honour: "
                f"pass {name}.filled(value) or {name}.data"
            )
        return np.asarray(A.data)
    return np.asarray(A)


def as_matrix(X):
    """``X`` as a 2-D NumPy array or SciPy sparse matrix (values unchecked); errors name ``X``.

    Examples
    --------
    >>> as_matrix([[1, 2], [3, 4]]).shape
    (2, 2)
    """
    if not sp.issparse(X) and not isinstance(X, np.ndarray):
        try:
            X = np.asarray(X)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"X must be an array of real numbers: {exc}") from exc
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (n samples x p features), got shape {X.shape}")
    return X


def check_sparse_structure(A, name: str = "A") -> None:
    """``ValueError`` where a sparse ``A``'s index arrays point outside it.

    SciPy checks them when a matrix is built, not after: an index changed in place (or arrays
    given with ``check_format`` skipped) reached the kernels, which read out of bounds (a column
    index of ``10**6`` crashed the process; a negative one gave the decomposition of another
    matrix). One pass over the stored indices (``indptr[-1]`` of them: storage past it is spare,
    as SciPy allows) and ``indptr``; COO's coordinates likewise.

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> A = sp.csr_matrix(np.eye(3))
    >>> check_sparse_structure(A)
    >>> A.indices[1] = 7
    >>> check_sparse_structure(A)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: A has column index 7 (stored entry 1) outside [0, 3): a malformed sparse matrix; ...
    """
    fmt = A.format
    hint = f"a malformed sparse matrix; see {name}.check_format(full_check=True)"
    if fmt == "coo":
        for axis, (what, coords) in enumerate((("row", A.row), ("column", A.col))):
            _check_indices(coords[: A.nnz], A.shape[axis], what, name, hint)
        return
    if fmt not in ("csr", "csc", "bsr"):
        return  # LIL, DOK, DIA: Python structures or offsets SciPy's conversions check
    major, minor = A.shape if fmt != "csc" else A.shape[::-1]
    if fmt == "bsr":
        major, minor = major // A.blocksize[0], minor // A.blocksize[1]
    indptr, indices = np.asarray(A.indptr), np.asarray(A.indices)
    stored = int(indptr[-1]) if indptr.ndim == 1 and indptr.size == major + 1 else -1
    if (
        stored < 0
        or indptr[0] != 0
        or stored > min(indices.size, A.data.shape[0])
        or (np.diff(indptr) < 0).any()
    ):
        raise ValueError(
            f"{name}'s indptr is not that of a {fmt.upper()} matrix of shape {A.shape}: it must hold "
            f"{major + 1} offsets from 0, never decreasing, to at most the {indices.size} stored "
            f"indices; {hint}"
        )
    _check_indices(indices[:stored], minor, "row" if fmt == "csc" else "column", name, hint)


def _check_indices(idx, bound: int, what: str, name: str, hint: str) -> None:
    if idx.size and (idx.min() < 0 or idx.max() >= bound):
        at = int(np.flatnonzero((idx < 0) | (idx >= bound))[0])
        raise ValueError(
            f"{name} has {what} index {idx[at]} (stored entry {at}) outside [0, {bound}): {hint}"
        )


def check_operand(
    A, rows: int | None, name: str = "A", *, check_finite_values: bool = True, rows_label: str | None = None
):
    """Validate the right-hand operand of ``S @ A``.

    Returns ``(A2, is_vector)`` where ``A2`` is a 2-D float32/float64 NumPy array or a CSR/CSC
    matrix with ``rows`` rows (any number if None); a vector becomes one column and integer
    input becomes float64. Arrays of other namespaces (CuPy, ...) are checked the same way and
    returned in their own namespace. NumPy subclasses become plain arrays (``np.matrix``; a masked
    array only without masked entries, else ``TypeError``). NaN/inf raise ``ValueError`` unless
    ``check_finite_values=False``, which skips that full pass over A for callers that check
    their (small) output instead (see ``SketchOperator.__matmul__``). ``rows_label`` says where
    the row count comes from in the message (e.g. ``"the sketch's input_dim"``).
    """
    why = f" ({rows_label})" if rows_label else ""
    if sp.issparse(A):
        sparse_vector = A.ndim == 1  # SciPy's 1-D coo_array: a vector, as a dense 1-D array is
        if sparse_vector:
            A = A.reshape((A.shape[0], 1))
        if A.ndim != 2:
            raise ValueError(f"{name} must be 2-D, got a sparse array with {A.ndim} dimensions")
        dt = _float_dtype_for(A.dtype, name)
        if rows is not None and A.shape[0] != rows:
            raise ValueError(f"{name} must have {rows} rows{why}, got shape {A.shape}")
        if A.shape[1] == 0 or A.shape[0] == 0:
            raise ValueError(f"{name} is empty (shape {A.shape}); expected at least one row and column")
        check_sparse_structure(A, name)
        if A.format != "csr":  # the kernels take CSR: its row pointers are O(rows) whatever the nonzeros
            check_allocation(
                8 * (A.shape[0] + 1) + A.nnz * (8 + A.dtype.itemsize),
                f"{name} ({A.format.upper()}, {A.shape[0]:,} x {A.shape[1]:,}) as CSR, with its row pointers",
                f"pass {name} with fewer rows",
            )
        # cast before a conversion sums duplicate entries: in int8 they wrapped (100 + 100 = -56) and
        # in bool they OR'd, so a COO matrix gave another S @ A than the same matrix as CSR
        A = A.astype(dt, copy=False)
        A = A.tocsr() if A.format not in _SPARSE_OK or A.format == "coo" else A
        if check_finite_values:
            check_finite(A, name)
        return A, sparse_vector
    if isinstance(A, np.ndarray) and type(A) is not np.ndarray:
        A = plain_ndarray(A, name)
    # CuPy's arrays have no __array_namespace__ (array_api_compat wraps CuPy) and refuse np.asarray
    if not (isinstance(A, np.ndarray) or hasattr(A, "__array_namespace__") or array_library(A) == "cupy"):
        try:
            A = np.asarray(A)
        except (ValueError, TypeError) as exc:
            raise TypeError(f"{name} must be an array of real numbers: {exc}") from exc
    if isinstance(A.dtype, np.dtype):
        dt = _float_dtype_for(A.dtype, name)
    else:  # another array namespace: classify its dtype through the array API
        dt = _float_dtype_for_namespace(A, name)
    if A.ndim not in (1, 2):
        raise ValueError(f"{name} must be 1-D or 2-D, got {A.ndim} dimensions (shape {A.shape})")
    if rows is not None and A.shape[0] != rows:
        raise ValueError(f"{name} must have {rows} rows{why}, got shape {A.shape}")
    if 0 in A.shape:
        raise ValueError(f"{name} is empty (shape {A.shape}); expected at least one row and column")
    is_vector = A.ndim == 1
    if isinstance(A, np.ndarray):
        A = A.astype(dt, copy=False)
        if is_vector:
            A = A[:, None]
    else:
        xp = array_namespace(A)
        A = xp.astype(A, getattr(xp, dt.name), copy=False)  # a copy of A is n k values on the device
        if is_vector:
            A = A[:, None]
    if check_finite_values:
        check_finite(A, name)
    return A, is_vector


def check_real_vector(value, length: int, name: str) -> np.ndarray:
    """``value`` as a finite float64 vector of shape ``(length,)``; errors name ``name``.

    Examples
    --------
    >>> check_real_vector([1, 2], 2, "beta").tolist()
    [1.0, 2.0]
    >>> check_real_vector([1.0, float("nan")], 2, "beta")
    Traceback (most recent call last):
    ...
    ValueError: beta contains NaN or infinite values
    """
    if isinstance(value, np.ma.MaskedArray):
        value = plain_ndarray(value, name)
    if sp.issparse(value):  # np.asarray made it a 0-d object array: "got dtype object"
        raise TypeError(
            f"{name} must be a dense 1-D array, got a sparse {type(value).__name__}: pass {name}.toarray()"
        )
    try:
        v = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a 1-D array of real numbers: {exc}") from exc
    if v.dtype.kind not in "iuf":
        raise TypeError(f"{name} must hold real numbers, got dtype {v.dtype}")
    if v.shape != (length,):
        raise ValueError(f"{name} must have shape ({length},), got {v.shape}")
    v = v.astype(np.float64)
    if not np.isfinite(v).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return v


def check_option(value, name: str, allowed) -> str:
    """A string option that must be one of ``allowed``."""
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {sorted(allowed)}, got {value!r}")
    return value


# ------------------------------------------------------------------------------------ named options
# The sketch families by kind name (rsketch.operators.factory maps each to its class).
SKETCH_KIND_NAMES = ("gaussian", "srht", "srdct", "countsketch", "sparse_sign", "leverage", "uniform")
# rsketch.lstsq's solvers and rsketch.efficiency's ways of taking the noise expectation.
LSTSQ_METHODS = ("sketch_and_solve", "precondition", "ihs")
# How lstsq's refinement solves for a correction (rsketch.linalg._precondition.choose_inner).
LSTSQ_INNER_SOLVERS = ("auto", "cg", "gram")
EFFICIENCY_METHODS = ("closed_form", "simulate")


def check_sketch_kind(kind, name: str = "kind") -> str:
    """A sketch family's name, one of :data:`SKETCH_KIND_NAMES`.

    Examples
    --------
    >>> check_sketch_kind("srht")
    'srht'
    >>> check_sketch_kind("hadamard", "sketch")
    Traceback (most recent call last):
    ...
    ValueError: sketch must be one of ['countsketch', 'gaussian', ...], got 'hadamard'
    """
    return check_option(kind, name, SKETCH_KIND_NAMES)


def check_seed(seed, name: str = "seed"):
    """Check a seed: None, a non-negative int, a ``SeedSequence``, a ``Generator`` or a legacy
    ``RandomState`` (scikit-learn's ``random_state`` convention; like a Generator, a key is drawn from
    it); returned as given.

    The one seed check of both packages (rsketch's operators and statistics, decoding's sampling).

    Examples
    --------
    >>> check_seed(3)
    3
    >>> check_seed(-1)
    Traceback (most recent call last):
    ...
    ValueError: seed must be a non-negative integer, got -1
    >>> check_seed("abc")
    Traceback (most recent call last):
    ...
    TypeError: seed must be None, a non-negative int, ... or a numpy.random.RandomState; got str 'abc'
    """
    if seed is None or isinstance(seed, (np.random.SeedSequence, np.random.Generator, np.random.RandomState)):
        return seed
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        if seed < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {shown_int(seed)}")
        return int(seed)
    raise TypeError(
        f"{name} must be None, a non-negative int, a numpy.random.SeedSequence, a numpy.random.Generator "
        f"or a numpy.random.RandomState; got {type(seed).__name__} {seed!r}"
    )


def seed_sequence(seed, name: str = "seed") -> np.random.SeedSequence:
    """A fresh ``SeedSequence`` from a checked seed, leaving the caller's object as it was.

    An int or a ``SeedSequence`` gives the same sequence in every process and on every machine;
    a ``Generator`` or ``RandomState`` gives one drawn from it (advancing it); ``None`` draws fresh OS
    entropy.

    Examples
    --------
    >>> seed_sequence(0).entropy == seed_sequence(np.random.SeedSequence(0)).entropy
    True
    >>> ss = np.random.SeedSequence(0); taken = ss.spawn(2)
    >>> seed_sequence(ss).spawn(1)[0].spawn_key, ss.n_children_spawned  # the next child; ss unchanged
    ((2,), 2)
    """
    seed = check_seed(seed, name)
    if isinstance(seed, np.random.SeedSequence):
        # A copy: spawning from the caller's object would change what it spawns next. It spawns after
        # the children the caller has taken (without n_children_spawned it spawned those again, and
        # a routine's sketches could repeat the caller's own).
        return np.random.SeedSequence(
            seed.entropy, spawn_key=seed.spawn_key, pool_size=seed.pool_size,
            n_children_spawned=seed.n_children_spawned,
        )  # fmt: skip
    if isinstance(seed, np.random.Generator):
        return np.random.SeedSequence(int(seed.integers(0, 2**63)))
    if isinstance(seed, np.random.RandomState):
        return np.random.SeedSequence(int(seed.randint(0, 2**63, dtype=np.int64)))
    return np.random.SeedSequence(seed)


# ------------------------------------------------------------------------------------ sizes and memory
# Rows, columns and Philox counters are int64 in the kernels: the largest size they can address.
MAX_INDEX = 2**63 - 1
# Allocations below this size are not checked (reading /proc/meminfo costs more than they do).
_CHECK_FROM = 64 * 2**20


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


#: A cgroup v1 ``memory.limit_in_bytes`` at or above this is "no limit" (the kernel writes a page-rounded
#: ``2**63 - 1``).
_CGROUP_V1_NO_LIMIT = 2**60


def _cgroup_headroom() -> int | None:
    """Bytes left under this process's cgroup memory limit (v2, or v1's memory controller), or None
    without a limit."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if line.startswith("0::"):
            base = "/sys/fs/cgroup" + path.rstrip("/")
            limit = _read_int(base + "/memory.max")  # "max" (no limit) reads as None
            used = _read_int(base + "/memory.current")
        elif "memory" in controllers.split(","):  # v1: a container's limit was read as the host's memory
            base = "/sys/fs/cgroup/memory" + path.rstrip("/")
            limit = _read_int(base + "/memory.limit_in_bytes")
            limit = None if limit is not None and limit >= _CGROUP_V1_NO_LIMIT else limit
            used = _read_int(base + "/memory.usage_in_bytes")
        else:
            continue
        if limit is not None and used is not None:
            return max(0, limit - used)
    return None


def _address_space_headroom() -> int | None:
    """Bytes of address space left under ``RLIMIT_AS`` (``ulimit -v``), or None without a limit: under
    one, a request the free memory allowed met numpy's own "Unable to allocate"."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    try:
        with open("/proc/self/status") as f:
            size = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:")), None)
    except (OSError, ValueError, IndexError):
        size = None
    return max(0, soft - size) if size is not None else soft


def available_memory() -> int | None:
    """Bytes of memory this process can still allocate without swapping, or None if unknown.

    ``MemAvailable`` from ``/proc/meminfo`` (the kernel's estimate, page cache included), else
    ``os.sysconf`` free pages; capped by the headroom under a cgroup memory limit (v2 or v1:
    containers) and under ``RLIMIT_AS`` (``ulimit -v``).

    Examples
    --------
    >>> m = available_memory()
    >>> m is None or m > 0
    True
    """
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        avail = None
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = None
    for headroom in (_cgroup_headroom(), _address_space_headroom()):
        if headroom is not None:
            avail = headroom if avail is None else min(avail, headroom)
    return avail


def _format_bytes(n: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


def check_allocation(nbytes: int, what: str, hint: str = "use smaller sizes") -> None:
    """Raise ``MemoryError`` before allocating ``nbytes`` when they exceed half the memory available.

    Half, not all: the rest is for the caller's own arrays and the system; an operation that takes
    nearly all the free memory ends in swapping or in the kernel's out-of-memory killer rather than
    in an error. ``what`` names the operation and its sizes, ``hint`` what the caller can do; the
    message gives both figures. Allocations under 64 MiB are not checked.

    Examples
    --------
    >>> check_allocation(10**3, "a small array")
    >>> check_allocation(2**80, "S @ A with sketch_size=10**20", "use a smaller sketch_size")
    Traceback (most recent call last):
    ...
    MemoryError: S @ A with sketch_size=10**20 needs 1.1e+12 TiB of memory, more than half of the ...; ...
    """
    nbytes = int(nbytes)
    if nbytes < _CHECK_FROM:
        return
    avail = available_memory()
    if avail is not None and nbytes > avail // 2:
        raise MemoryError(
            f"{what} needs {_format_bytes(nbytes)} of memory, more than half of the {_format_bytes(avail)} "
            f"available; {hint}"
        )


def check_real(value, name: str) -> float:
    """A real number (not a bool, not a string) as a float; ``TypeError`` naming ``name`` otherwise.

    Examples
    --------
    >>> check_real(0.5, "uniform_mix")
    0.5
    >>> check_real("a", "uniform_mix")
    Traceback (most recent call last):
    ...
    TypeError: uniform_mix must be a real number, got str 'a'
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    return float(value)
