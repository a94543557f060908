"""The NumPy backend: arrays are plain ``numpy.ndarray``."""
import numpy as np

from gdnflow.errors import DTypeError
from gdnflow.precision import BFLOAT16, FLOAT16, as_dtype


class NumpyBackend:
    """Reference backend. Supports float32 (default), float64 (gradient checks) and the
    16-bit float16 and bfloat16, which it computes as the GPU does (gdnflow.precision)."""

    name = "numpy"
    dtypes = (np.dtype(np.float32), np.dtype(np.float64), FLOAT16, BFLOAT16)
    array_type = np.ndarray

    def check_dtype(self, dtype):
        """Return ``dtype`` as a numpy dtype, or raise DTypeError if unsupported."""
        dtype = as_dtype(dtype)
        if dtype not in self.dtypes:
            raise DTypeError(f"numpy backend supports {[str(d) for d in self.dtypes]}, got {dtype}")
        return dtype

    def from_numpy(self, array):
        """A C-ordered copy of a NumPy array: a tensor never shares the caller's
        array, which in-place updates (optimisers) would otherwise overwrite."""
        return np.array(array, order="C", copy=True)

    def to_numpy(self, array):
        """Return the array itself: it already is a NumPy array."""
        return array

    def empty(self, shape, dtype):
        """An uninitialised array."""
        return np.empty(shape, dtype)

    def full(self, shape, value, dtype):
        """An array filled with ``value``."""
        return np.full(shape, value, dtype)

    def synchronize(self):
        """Nothing to wait for: NumPy is synchronous."""


def contiguous(array):
    """``array`` in C order, copied only if needed; unlike np.ascontiguousarray
    it keeps a 0-d array 0-d."""
    array = np.asarray(array)
    return array if array.flags.c_contiguous else array.copy(order="C")
