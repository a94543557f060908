"""``cast``: a tensor converted to another floating dtype. CUDA kernels: ``cuda_src/cast.cu``.

Between float32 and the 16-bit floats (float16, bfloat16) on the GPU, and
between any of the NumPy backend's dtypes (float64 too) on NumPy. Rounding to
a narrower dtype is to nearest, ties to even, on both backends, so the GPU's
results equal NumPy's bit for bit. (From float64, which only NumPy holds,
ml_dtypes reaches bfloat16 through float32: two roundings.) The gradient is
the output's gradient cast back to the input's dtype: a float32 parameter
used in 16 bits under :func:`gdnflow.autocast` gets a float32 gradient.
"""
import numpy as np

from gdnflow.autograd import Operator
from gdnflow.backends import cuda, get_backend
from gdnflow.registry import register

SOURCE = "cast.cu"


@register("cast")
class CastOp(Operator):
    """y = x converted to ``dtype`` (a NumPy dtype or a name such as ``"bf16"``)."""

    autocast = "exempt"     # autocast's own conversions

    def __init__(self, dtype):
        self.dtype = dtype

    def check(self, x):
        self.dtype = get_backend(x.device).check_dtype(self.dtype)
        self.input_dtype = x.dtype

    def forward_numpy(self, x):
        with np.errstate(over="ignore"):    # past the dtype's largest: infinity, as on the GPU
            return x.astype(self.dtype)

    def forward_cuda(self, x):
        if x.dtype == self.dtype:       # a copy, as NumPy's astype makes
            return cuda.get_runtime().copy(x)
        y = cuda.empty(x.shape, self.dtype)
        if x.size:      # cast.cu converts every pair of the backend's dtypes
            cuda.kernel(SOURCE, f"{x.dtype.name}_to_{self.dtype.name}", "PPi").launch(
                x.size, x.ptr, y.ptr, x.size)
        return y

    def backward(self, grad_output):
        return (CastOp(self.input_dtype)(grad_output),)


def cast(x, dtype):
    """``x`` as ``dtype`` (``"float32"``, ``"bf16"``, ``"fp16"``, a NumPy dtype); differentiable.

    ``x`` itself when it already has that dtype.
    """
    if x.dtype == get_backend(x.device).check_dtype(dtype):
        return x
    return CastOp(dtype)(x)


def cast_array(array, dtype):
    """A backend array (NumPy or CUDA) converted to ``dtype`` (a numpy dtype), outside autograd.

    For operators that compute a 16-bit input in float32 inside their own
    forward or backward; ``array`` itself where it already has that dtype.
    """
    if array.dtype == dtype:
        return array
    op = CastOp(dtype)
    return op.forward_numpy(array) if isinstance(array, np.ndarray) else op.forward_cuda(array)
