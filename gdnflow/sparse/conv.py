"""``sparse_conv2d``: direct sparse convolution with a CSR filter (:mod:`gdnflow.sparse.csr`).

Shapes and formula, for x [N, C_in, H, W] and a :class:`~gdnflow.sparse.csr.CSRWeight`
of shape [C_out, C_in, kh, kw] (dilation (dh, dw) part of the CSR), groups 1::

    y[n, o, p, q] = b[o] + sum_{k in row o} values[k]
                    * x[n, c_k, p*sh - top + i_k*dh, q*sw - left + j_k*dw]

zero outside the input; OH, OW as for :func:`gdnflow.ops.conv2d`. In CSR terms,
with xp the input padded to Hp x Wp, ``y[n, o].flat[p*OW + q] = sum_k values[k]
* xp[n].flat[offsets[k] + p*sh*Wp + q*sw]``.

Inputs: x, values [nnz] and optionally bias [C_out], all differentiable.
The pattern (which taps are non-zero) is fixed by the CSRWeight and is not.

The operator is registered as ``"sparse_conv2d"``. Its NumPy path is
:mod:`gdnflow.sparse.reference`, its GPU path :mod:`gdnflow.sparse.cuda_plan`
(kernels in ``cuda_src/sparse_conv.cu``); ``docs/sparse.md`` says why the
GPU path is built as it is.
"""
import numpy as np

from gdnflow.autograd import Operator
from gdnflow.errors import ShapeError
from gdnflow.ops.conv import conv_parameters
from gdnflow.ops.reduction import sum_cuda
from gdnflow.registry import register
from gdnflow.sparse.csr import CSRWeight
from gdnflow.sparse.cuda_plan import backward_data_cuda, backward_values_cuda, forward_cuda
from gdnflow.sparse.geometry import sparse_geometry
from gdnflow.sparse.reference import backward_data_numpy, backward_values_numpy, forward_numpy
from gdnflow.tensor import Tensor


@register("sparse_conv2d")
class SparseConv2dOp(Operator):
    """y = conv(x, the CSR filter with ``values``) + b; see the module docstring.

    Inputs: x [N, C_in, H, W], values [nnz] (the filter's entries, in CSR
    order) and, when ``has_bias``, b [C_out]. The CSRWeight fixes the
    pattern; its stored offsets may be for any padded size (they are
    recomputed for this input's).
    """

    def __init__(self, weight, stride=1, padding=0, has_bias=False):
        if not isinstance(weight, CSRWeight):
            raise TypeError(f"sparse_conv2d: weight must be a CSRWeight (see "
                            f"gdnflow.sparse.to_csr), got {type(weight).__name__}")
        self.weight = weight
        self.stride, self.padding, _, _ = conv_parameters("sparse_conv2d", stride, padding, 1, 1)
        self.has_bias = bool(has_bias)

    def check(self, x, values, *extras):
        if len(extras) != self.has_bias:
            raise TypeError(f"{self.label}: expected {2 + self.has_bias} input tensors, "
                            f"got {2 + len(extras)}")
        self.geometry = g = sparse_geometry(self.label, x.shape, self.weight, self.stride,
                                            self.padding)
        if values.shape != (self.weight.nnz,):
            raise ShapeError(f"{self.label}: values must have shape ({self.weight.nnz},) (the "
                             f"filter's entries), got {values.shape}")
        if self.has_bias and extras[0].shape != (g.c_out,):
            raise ShapeError(f"{self.label}: bias must have shape ({g.c_out},), "
                             f"got {extras[0].shape}")

    def _forward(self, x, values, *extras):
        # x is what the values' gradient needs, the values what x's gradient needs.
        need_x_grad, need_values_grad = (self.needs_grad or (False, False))[:2]
        self.save(x=x if need_values_grad else None, values=values if need_x_grad else None)
        bias = extras[0] if self.has_bias else None
        return self.dispatch("run_forward", x, values, bias)

    forward_numpy = forward_cuda = _forward

    def run_forward_numpy(self, x, values, bias):
        return forward_numpy(self.geometry, self.weight, x, values, bias)

    def run_forward_cuda(self, x, values, bias):
        return forward_cuda(self.geometry, self.weight, x, values, bias)

    def backward(self, grad_output):
        g, csr = self.geometry, self.weight
        x, values = self.saved.x, self.saved.values
        gy = grad_output.data
        need = self.needs_grad
        numpy = self.device == "numpy"
        gx = gvalues = gbias = None
        if need[0]:
            gx = (backward_data_numpy if numpy else backward_data_cuda)(g, csr, gy, values)
        if need[1]:
            gvalues = (backward_values_numpy if numpy else backward_values_cuda)(g, csr, x, gy)
        if self.has_bias and need[2]:
            if numpy:
                gbias = gy.sum(axis=(0, 2, 3))
            else:
                gbias = sum_cuda(gy, (0, 2, 3), 1.0).reshape((g.c_out,))
        grads = [gx, gvalues] + ([gbias] if self.has_bias else [])
        return tuple(None if a is None else self.wrap(a) for a in grads)


def values_tensor(weight, device, dtype=np.float32):
    """The CSR's stored values as a constant tensor on ``device`` (cached in the CSR)."""
    key = ("values", device, np.dtype(dtype).str)
    tensor = weight.cache.get(key)
    if tensor is None:
        tensor = weight.cache[key] = Tensor(weight.values, device=device, dtype=dtype)
    return tensor


def sparse_conv2d(x, weight, values=None, bias=None, stride=1, padding=0):
    """Direct sparse convolution of x [N, C_in, H, W] with the CSR filter ``weight``.

    ``y[n, o, p, q] = b[o] + sum_{(c, i, j) in row o} w[o, c, i, j] * x[n, c,
    p*sh - top + i*dh, q*sw - left + j*dw]`` (zero outside x), the same
    function as :func:`gdnflow.ops.conv2d` with ``weight.to_dense()``;
    y is [N, C_out, OH, OW] with OH = floor((H + top + bottom - dh*(kh-1) - 1)/sh) + 1.

    ``weight``: a :class:`~gdnflow.sparse.csr.CSRWeight` (from
    :func:`~gdnflow.sparse.csr.to_csr`; dilation is part of it). ``values``:
    a tensor [nnz] of the entries, differentiable; None uses the CSR's own
    values as a constant. ``bias`` [C_out] is optional. ``stride``: an int
    or (sh, sw); ``padding``: an int, (ph, pw) or (top, bottom, left, right).
    Gradients reach x, values and bias.
    """
    if values is None and isinstance(weight, CSRWeight):
        values = values_tensor(weight, x.device, x.dtype)
    op = SparseConv2dOp(weight, stride, padding, has_bias=bias is not None)
    return op(*((x, values) if bias is None else (x, values, bias)))
