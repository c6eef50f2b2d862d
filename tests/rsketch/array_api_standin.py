"""``array_api_strict`` on its second device: the stand-in for a GPU library in the CPU tests.

Arrays on ``Device("device1")`` refuse NumPy's implicit conversion (``np.asarray`` raises, as on CuPy)
and any arithmetic with arrays of the default device, so a solver that passes with them keeps its
work in the input's namespace and on its device.
"""

import numpy as np
import pytest

xps = pytest.importorskip("array_api_strict", reason="install the test extra: array-api-strict")
DEVICE = xps.Device("device1")


def on_device(a, **kwargs):
    """``a`` as an ``array_api_strict`` array on the stand-in device."""
    return xps.asarray(a, device=DEVICE, **kwargs)


def host(a):
    """A NumPy array of ``a``'s values (DLPack); a Python float (an estimator's ``intercept_`` without
    ``fit_intercept``, as scikit-learn's) as a 0-d array."""
    return np.asarray(a) if isinstance(a, float) else np.from_dlpack(a)


@pytest.fixture
def device_by_default(monkeypatch):
    """``array_api_strict``'s creation functions put new arrays on ``DEVICE`` unless told otherwise, as
    CuPy puts every new array on the GPU: an array the code makes without a device and then hands to
    NumPy (which the default device accepts) fails here, as it would on CuPy."""
    for name in ("arange", "asarray", "empty", "eye", "full", "linspace", "ones", "zeros"):
        make = getattr(xps, name)

        def on_device_by_default(*args, _make=make, device=None, **kwargs):
            return _make(*args, device=DEVICE if device is None else device, **kwargs)

        monkeypatch.setattr(xps, name, on_device_by_default)
