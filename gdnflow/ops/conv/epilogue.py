"""The pass after a convolution: y <- act(y + bias[c] + residual), and its gradients.

On both backends (NumPy, and one kernel of ``cuda_src/conv2d.cu``). Algorithms
that fuse the epilogue into their own kernels skip this pass; the others
leave it to the operator. ``activation`` is a code of
:data:`~gdnflow.ops.conv.geometry.ACTIVATIONS` (0 identity, 1 relu, 2 relu6).
"""
import numpy as np

from gdnflow.backends import cuda
from gdnflow.backends.cuda.limits import division_constants
from gdnflow.ops.cast import CastOp
from gdnflow.ops.reduction import sum_cuda
from gdnflow.precision import FLOAT32, emulate

SOURCE = "conv2d.cu"


def epilogue_numpy(y, bias, residual, activation, in_place=False):
    """act(y + bias[c] + residual); None skips a term, activation 0 is the identity.

    ``in_place``: overwrite y (which the caller owns) instead of allocating the result.
    """
    out = y if in_place else None
    if bias is not None:
        y = np.add(y, bias.reshape(1, -1, 1, 1), out=out)
    if residual is not None:
        y = np.add(y, residual, out=out)
    if activation == 1:
        y = np.maximum(y, 0, out=out)
    elif activation == 2:
        y = np.clip(y, 0, 6, out=out)
    return y


def activation_grad_numpy(gy, y, activation):
    """gy where the activation passed its input (read from its output y), else 0."""
    passed = (y > 0) if activation == 1 else (y > 0) & (y < 6)
    return np.where(passed, gy, 0).astype(gy.dtype)


#: Bytes per access of the vector forms of the pass (``conv_epilogue_vectors<bytes>``),
#: widest first.
VECTOR_BYTES = (16, 8, 4)


def vector_bytes(y, residual):
    """Bytes per access of :func:`epilogue_cuda` on ``y``: the widest of
    :data:`VECTOR_BYTES` holding more than one value, a whole number of which make a
    plane, to which y and the residual are aligned; else None (one value per access).
    (The bias is read one value per vector: its alignment does not matter.)"""
    n, c = y.shape[:2]
    plane = y.size // (n * c)
    for size in VECTOR_BYTES:
        values = size // y.dtype.itemsize
        if values > 1 and plane % values == 0 and all(
                a.ptr % size == 0 for a in (y, residual) if a is not None):
            return size
    return None


def epilogue_cuda(y, bias, residual, activation):
    """y <- act(y + bias[c] + residual) in one pass, in place; returns y.

    :func:`vector_bytes` per access (``conv_epilogue_vectors16/8/4``), else one
    value per access (``conv_epilogue``).
    """
    n, c = y.shape[:2]
    if y.size == 0:
        return y
    size = vector_bytes(y, residual)
    name = "conv_epilogue" if size is None else f"conv_epilogue_vectors{size}"
    items = y.size if size is None else y.size // (size // y.dtype.itemsize)
    cuda.kernel(SOURCE, name, "PPPPiiIIIIi", cuda.storage_defines(y.dtype)).launch(
        items, y.ptr, 0 if bias is None else bias.ptr, 0 if residual is None else residual.ptr,
        y.ptr, items, c, *division_constants(items // (n * c)), *division_constants(c),
        activation)
    return y


def activation_grad_cuda(gy, y, activation):
    """As :func:`activation_grad_numpy`, one kernel."""
    gz = cuda.empty(gy.shape, gy.dtype)
    cuda.kernel(SOURCE, "conv_activation_backward", "PPPii",
                cuda.storage_defines(gy.dtype)).launch(
        gy.size, gy.ptr, y.ptr, gz.ptr, gy.size, activation)
    return gz


def bias_grad(device, gy):
    """gy [N, C, H, W] summed over N, H, W: [C] (the bias's gradient).

    A 16-bit gy is summed in float32 and the sum rounded once.
    """
    if device == "numpy":
        return emulate(lambda g: g.sum(axis=(0, 2, 3)), gy)
    if gy.dtype == FLOAT32:
        return sum_cuda(gy, (0, 2, 3), 1.0).reshape((gy.shape[1],))
    wide = CastOp(FLOAT32).forward_cuda(gy)
    return CastOp(gy.dtype).forward_cuda(sum_cuda(wide, (0, 2, 3), 1.0).reshape((gy.shape[1],)))
