"""Matrix products: ``linear`` (a fully connected layer) and ``matmul``.

No kernels of their own: on the GPU every product is one cuBLAS SGEMM (or
strided-batched SGEMM) through :mod:`gdnflow.backends.cuda.blas`, and the
bias is laid down first by the elementwise ``broadcast_copy`` kernel so that
the GEMM adds onto it (beta = 1) instead of a second pass over y.

Both also run on 16-bit tensors (float16, bfloat16), as GemmEx products on
the tensor cores with float32 accumulation, the result rounded once; under
:func:`gdnflow.autocast` their float32 inputs are rounded to 16 bits
(``autocast = "lower"``). The 16-bit bias gradient is a product too (a row
of ones times gy), so that it also sums in float32.

Shapes and formulas (row-major, PyTorch's weight layout)::

    linear:  x [..., in], w [out, in], b [out]  ->  y [..., out]
             y = x @ w^T + b
             gx = gy @ w,  gw = gy^T @ x,  gb = sum of gy over all but the last axis
    matmul:  a [m, k] or [B, m, k], b [k, n] or [B, k, n]  ->  [m, n] or [B, m, n]
             y[i] = a[i] @ b[i]; a 2-D operand (or a batch of 1) is used for every i
             ga[i] = gy[i] @ b[i]^T,  gb[i] = a[i]^T @ gy[i], summed over i where
             the operand was shared
"""
import math

import numpy as np

from gdnflow.autograd import Operator
from gdnflow.backends import cuda
from gdnflow.errors import ShapeError
from gdnflow.ops.cast import CastOp
from gdnflow.ops.reduction import BroadcastToOp, sum_cuda
from gdnflow.ops.shape import ReshapeOp
from gdnflow.precision import emulate, is_half
from gdnflow.registry import register


def _keep_for_backward(op):
    """(keep the first operand, keep the second) for the backward of the product ``op``.

    In a product each operand feeds only the *other* operand's gradient, so
    an operand is kept when the other's gradient is asked for; nothing is
    kept when no graph is recorded (inference frees activations at once).
    """
    if not op.recording:
        return False, False
    return op.needs_grad[1], op.needs_grad[0]


@register("linear")
class LinearOp(Operator):
    """y = x @ w^T + b for x [..., in], w [out, in] and the optional b [out].

    The leading dimensions of x are flattened into the GEMM's rows (M), so a
    [N, in] batch and a [N, T, in] sequence are one GEMM each.
    """

    autocast = "lower"

    def check(self, x, w, *bias):
        if len(bias) > 1:
            raise TypeError(f"{self.label}: expected x, w and an optional b, got {2 + len(bias)} "
                            "inputs")
        if w.ndim != 2:
            raise ShapeError(f"{self.label}: weight must be 2-D [out, in], got shape {w.shape}")
        if x.ndim < 1 or x.shape[-1] != w.shape[1]:
            raise ShapeError(f"{self.label}: input must be [..., {w.shape[1]}] for a weight of "
                             f"shape {w.shape} ([out, in]), got {x.shape}")
        if bias and bias[0].shape != (w.shape[0],):
            raise ShapeError(f"{self.label}: bias must have shape ({w.shape[0]},) (one per "
                             f"output feature), got {bias[0].shape}")
        self.out_shape = x.shape[:-1] + (w.shape[0],)

    def forward_numpy(self, x, w, b=None):
        keep_x, keep_w = _keep_for_backward(self)
        self.save(x=x if keep_x else None, w=w if keep_w else None)
        return emulate(lambda x, w, b: x @ w.T if b is None else x @ w.T + b, x, w, b)

    def forward_cuda(self, x, w, b=None):
        from gdnflow.backends.cuda import blas     # local import: PyCUDA on first use
        rows, (out, inp) = math.prod(x.shape[:-1]), w.shape
        if b is None:
            y, beta = cuda.empty(self.out_shape, x.dtype), 0.0
        else:
            y, beta = BroadcastToOp((rows, out)).forward_cuda(b).reshape(self.out_shape), 1.0
        if rows and out:
            blas.matmul(x.ptr, w.ptr, y.ptr, rows, out, inp, trans_b=True, beta=beta,
                        dtype=x.dtype)
        keep_x, keep_w = _keep_for_backward(self)
        self.save(x=x if keep_x else None, w=w if keep_w else None)
        return y

    def backward(self, grad_output):
        grads = self.dispatch("backward", grad_output.data)
        return tuple(None if g is None else self.wrap(g) for g in grads)

    def backward_numpy(self, gy):
        return emulate(self._gradients_numpy, gy, self.saved.x, self.saved.w)

    def _gradients_numpy(self, gy, x, w):
        need = self.needs_grad
        g2 = gy.reshape(-1, gy.shape[-1])                                 # [M, out]
        gx = (gy @ w) if need[0] else None
        gw = (g2.T @ x.reshape(-1, x.shape[-1])) if need[1] else None
        gb = g2.sum(axis=0) if len(need) > 2 and need[2] else None
        return (gx, gw) + ((gb,) if len(need) > 2 else ())

    def backward_cuda(self, gy):
        from gdnflow.backends.cuda import blas     # local import: PyCUDA on first use
        x, w = self.saved.x, self.saved.w
        need = self.needs_grad
        out, inp = self.input_shapes[1]
        rows = math.prod(self.input_shapes[0][:-1])
        dtype = gy.dtype
        gx = gw = gb = None
        if need[0]:
            gx = cuda.zeros(self.input_shapes[0], dtype) if not out else cuda.empty(
                self.input_shapes[0], dtype)
            if rows and out:
                blas.matmul(gy.ptr, w.ptr, gx.ptr, rows, inp, out, dtype=dtype)    # gy @ w
        if need[1]:
            gw = cuda.zeros((out, inp), dtype) if not rows else cuda.empty((out, inp), dtype)
            if rows and out:
                blas.matmul(gy.ptr, x.ptr, gw.ptr, out, inp, rows, trans_a=True,  # gy^T @ x
                            dtype=dtype)
        if len(need) > 2 and need[2]:
            if not is_half(dtype):
                gb = sum_cuda(gy.reshape((rows, out)), (0,), 1.0).reshape((out,))
            elif not rows:
                gb = cuda.zeros((out,), dtype)
            else:           # a row of ones times gy: summed in float32 by the tensor cores
                ones = cuda.get_runtime().full((rows,), 1.0, dtype)
                gb = cuda.empty((out,), dtype)
                blas.matmul(ones.ptr, gy.ptr, gb.ptr, 1, out, rows, dtype=dtype)
        return (gx, gw) + ((gb,) if len(need) > 2 else ())


@register("matmul")
class MatMulOp(Operator):
    """a @ b for 2-D matrices or batches of them (3-D), as ONNX MatMul and Gemm need.

    a [m, k] or [Ba, m, k]; b [k, n] or [Bb, k, n]. With two batches, Ba and
    Bb must agree or one be 1; a 2-D operand or a batch of 1 is used for
    every product (the GEMM reads it with batch stride 0). The result is
    [m, n] for two matrices, [B, m, n] otherwise.
    """

    autocast = "lower"

    def check(self, a, b):
        if a.ndim not in (2, 3) or b.ndim not in (2, 3):
            raise ShapeError(f"{self.label}: operands must be 2-D or 3-D (batched) matrices, "
                             f"got shapes {a.shape} and {b.shape}")
        if a.shape[-1] != b.shape[-2]:
            raise ShapeError(f"{self.label}: inner dimensions differ: shapes {a.shape} and "
                             f"{b.shape} ({a.shape[-1]} != {b.shape[-2]})")
        ba = a.shape[0] if a.ndim == 3 else 1
        bb = b.shape[0] if b.ndim == 3 else 1
        if ba != bb and 1 not in (ba, bb):
            raise ShapeError(f"{self.label}: batch sizes {ba} and {bb} differ (shapes {a.shape} "
                             f"and {b.shape}); they must agree or one be 1")
        self.batch = max(ba, bb)
        self.m, self.k, self.n = a.shape[-2], a.shape[-1], b.shape[-1]
        batched = a.ndim == 3 or b.ndim == 3
        self.out_shape = ((self.batch,) if batched else ()) + (self.m, self.n)

    def forward_numpy(self, a, b):
        keep_a, keep_b = _keep_for_backward(self)
        self.save(a=a if keep_a else None, b=b if keep_b else None)
        return emulate(np.matmul, a, b)

    def forward_cuda(self, a, b):
        keep_a, keep_b = _keep_for_backward(self)
        self.save(a=a if keep_a else None, b=b if keep_b else None)
        m, n, k = self.m, self.n, self.k
        if k == 0:                      # an empty sum: cuBLAS would leave y unwritten
            return cuda.zeros(self.out_shape, a.dtype)
        y = cuda.empty(self.out_shape, a.dtype)
        if not y.size:
            return y
        if self._b_serves_every_product():
            # a [B, m, k] is [B*m, k] and y [B, m, n] is [B*m, n]: one GEMM, not B small
            # ones (an ONNX MatMul of an N-D activation by a weight, as in ConvNeXt).
            self._gemm(a, b, y, self.batch * m, n, k, False, False, 0, 0, 0, batch=1)
        else:
            self._gemm(a, b, y, m, n, k, False, False, self._stride(a, m * k),
                       self._stride(b, k * n), m * n)
        return y

    def _stride(self, array, matrix):
        """The batch stride of an operand: 0 where one matrix serves the whole batch."""
        return matrix if array.ndim == 3 and array.shape[0] > 1 else 0

    def _b_serves_every_product(self):
        """Whether a is a batch and b one matrix used by all of its products."""
        a_shape, b_shape = self.input_shapes
        return self.batch > 1 and len(a_shape) == 3 and math.prod(b_shape) == self.k * self.n

    def _gemm(self, a, b, c, m, n, k, trans_a, trans_b, stride_a, stride_b, stride_c,
              batch=None):
        from gdnflow.backends.cuda import blas     # local import: PyCUDA on first use
        blas.matmul(a.ptr, b.ptr, c.ptr, m, n, k, trans_a, trans_b,
                    batch=self.batch if batch is None else batch,
                    stride_a=stride_a, stride_b=stride_b, stride_c=stride_c, dtype=a.dtype,
                    out_dtype=c.dtype)

    def backward(self, grad_output):
        grads = self.dispatch("backward", grad_output.data)
        return tuple(None if g is None else self.wrap(g) for g in grads)

    def backward_numpy(self, gy):
        return emulate(self._gradients_numpy, gy, self.saved.a, self.saved.b)

    def _gradients_numpy(self, gy, a, b):
        ga = gb = None
        # np.matmul broadcast the batch; the gradients sum it back where an
        # operand was shared (a 2-D operand or a batch of 1).
        if self.needs_grad[0]:
            ga = np.matmul(gy, np.swapaxes(b, -1, -2))
            ga = _sum_batch(ga, self.input_shapes[0])
        if self.needs_grad[1]:
            gb = np.matmul(np.swapaxes(a, -1, -2), gy)
            gb = _sum_batch(gb, self.input_shapes[1])
        return ga, gb

    def backward_cuda(self, gy):
        from gdnflow.backends.cuda import blas     # local import: PyCUDA on first use
        a, b = self.saved.a, self.saved.b
        m, n, k, batch = self.m, self.n, self.k, self.batch
        a_shape, b_shape = self.input_shapes
        dtype = gy.dtype
        ga = gb = None
        if self.needs_grad[0]:
            shared = math.prod(a_shape) == m * k and batch > 1
            if not gy.size:
                ga = cuda.zeros(a_shape, dtype)
            elif shared:            # sum_i gy[i] @ b[i]^T: per-product terms, then a batch sum
                terms = cuda.empty((batch, m, k))       # float32 terms: the sum stays float32
                self._gemm(gy, b, terms, m, k, n, False, True, m * n, self._stride(b, k * n), m * k)
                ga = sum_cuda(terms, (0,), 1.0).reshape(a_shape)
                ga = CastOp(dtype).forward_cuda(ga)
            elif self._b_serves_every_product():
                ga = cuda.empty(a_shape, dtype)     # [B*m, k] = gy [B*m, n] @ b^T, one GEMM
                self._gemm(gy, b, ga, batch * m, k, n, False, True, 0, 0, 0, batch=1)
            else:
                ga = cuda.empty(a_shape, dtype)
                self._gemm(gy, b, ga, m, k, n, False, True, m * n, self._stride(b, k * n), m * k)
        if self.needs_grad[1]:
            shared = math.prod(b_shape) == k * n and batch > 1
            if not gy.size:
                gb = cuda.zeros(b_shape, dtype)
            elif shared:
                # b shared means a is batched (both shared would make batch 1):
                # sum_i a[i]^T @ gy[i] is then one GEMM, a as [B*m, k] and gy
                # as [B*m, n] being contiguous and the sum running along rows.
                gb = cuda.empty(b_shape, dtype)
                blas.matmul(a.ptr, gy.ptr, gb.ptr, k, n, batch * m, trans_a=True, dtype=dtype)
            else:
                gb = cuda.empty(b_shape, dtype)
                self._gemm(a, gy, gb, k, n, m, True, False, self._stride(a, m * k), m * n, k * n)
        return ga, gb


def _sum_batch(g, shape):
    """g [B, r, c] summed to ``shape`` ([r, c] or [1, r, c]) where an operand was shared."""
    if g.shape == tuple(shape):
        return g
    return np.ascontiguousarray(g.sum(axis=0).reshape(shape))


def linear(x, w, b=None):
    """Fully connected layer: y = x @ w^T + b.

    x [..., in], w [out, in] (PyTorch's layout), b [out] or None; y [..., out].
    Gradients: gx = gy @ w, gw = gy^T @ x, gb = gy summed over the leading axes.
    """
    return LinearOp()(x, w) if b is None else LinearOp()(x, w, b)


def matmul(a, b):
    """Matrix product with NumPy's (and ONNX MatMul's) semantics.

    a [..., m, k] @ b [..., k, n] -> [..., m, n], the leading (batch)
    dimensions broadcasting; a 1-D a is a row [1, k] and a 1-D b a column
    [k, 1], their added dimension dropped from the result (1-D @ 1-D is a
    scalar). The products run as one (strided-batched) GEMM: an operand whose
    batch is all ones is shared by every product without a copy; one whose
    batch must be broadcast against the other's is expanded first
    (``broadcast_to``, whose gradient sums the copies back).
    """
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"matmul: operands must have at least one dimension, got shapes "
                         f"{a.shape} and {b.shape}")
    a_shape, b_shape = a.shape, b.shape
    row, column = a.ndim == 1, b.ndim == 1
    if row:
        a = ReshapeOp((1,) + a_shape)(a)
    if column:
        b = ReshapeOp(b_shape + (1,))(b)
    (m, k), (k2, n) = a.shape[-2:], b.shape[-2:]
    if k != k2:
        raise ShapeError(f"matmul: inner dimensions differ: shapes {a_shape} and {b_shape} "
                         f"({k} != {k2})")
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ShapeError(f"matmul: batch dimensions of shapes {a_shape} and {b_shape} do not "
                         "broadcast") from None
    count = math.prod(batch)

    def as_gemm_operand(t, rows, cols):
        """t as [rows, cols] (shared by the batch) or [count, rows, cols]."""
        own = t.shape[:-2]
        if math.prod(own) == 1:
            return t if t.ndim == 2 else ReshapeOp((rows, cols))(t)
        if (1,) * (len(batch) - len(own)) + own != batch:
            t = BroadcastToOp(batch + (rows, cols))(t)
        return t if t.ndim == 3 else ReshapeOp((count, rows, cols))(t)

    y = MatMulOp()(as_gemm_operand(a, m, k), as_gemm_operand(b, k, n))
    out_shape = batch + ((m,) if not row else ()) + ((n,) if not column else ())
    return y if y.shape == out_shape else ReshapeOp(out_shape)(y)
