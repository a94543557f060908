"""Transposed 2-D convolution: the adjoint of :func:`~gdnflow.ops.conv.operator.conv2d`.

No kernels of its own. For the convolution C whose input has this
operator's output shape and whose weight is this operator's weight, with
the same stride, padding, dilation and groups:

    conv_transpose2d(x, w)  = C's backward-data applied to x
    its backward-data       = C's forward (gx = conv2d(gy, w))
    its backward-weight     = C's backward-weight with the roles of input and
                              gradient swapped (gw from gy and x)

so every algorithm of conv2d (im2col + GEMM, pointwise GEMM, depthwise
kernels, Winograd, the sub-pixel rewrite) serves it too, chosen by the same
planner. An algorithm whose ``backward_data_fuses_bias`` is true takes the
bias into that pass (the sub-pixel rewrite adds it in Winograd's output
transform); otherwise the bias is one pass after it.
"""
from gdnflow.autograd import Operator
from gdnflow.errors import ShapeError
from gdnflow.ops.conv.epilogue import bias_grad, epilogue_cuda, epilogue_numpy
from gdnflow.ops.conv.geometry import conv_parameters, conv_transpose_geometry, int_tuple
from gdnflow.ops.conv.planning import run_stage
from gdnflow.registry import register


@register("conv_transpose2d")
class ConvTranspose2dOp(Operator):
    """y = conv_transpose2d(x, w) + b; inputs x, w and, if ``has_bias``, b.

    x [N, C_in, H, W], w [C_in, C_out/groups, kh, kw] (PyTorch's layout),
    b [C_out]; y [N, C_out, OH, OW] with
    ``OH = (H - 1)*sh - top - bottom + dh*(kh - 1) + output_padding_h + 1``
    (OW likewise). Each input pixel scatters w[c] into the output::

        y[n, g*C_out/groups + o, p*sh - top + i*dh, q*sw - left + j*dw]
            += x[n, c, p, q] * w[c, o, i, j]      (c in group g)

    ``output_padding`` (< stride) adds rows/columns at the bottom/right to
    pick among the input sizes a strided conv2d maps to the same output size.

    16-bit tensors and autocast as :class:`~gdnflow.ops.conv.operator.Conv2dOp`:
    a stage runs as 16-bit GEMMs where an algorithm does, else in float32
    with its result rounded once.
    """

    autocast = "lower"

    def __init__(self, stride=1, padding=0, output_padding=0, dilation=1, groups=1,
                 has_bias=False):
        op = "conv_transpose2d"
        self.stride, self.padding, self.dilation, self.groups = conv_parameters(
            op, stride, padding, dilation, groups)
        self.output_padding = int_tuple(op, "output_padding", output_padding, 2, 0)
        if any(o >= s for o, s in zip(self.output_padding, self.stride)):
            raise ValueError(f"{op}: output_padding {self.output_padding} must be smaller than "
                             f"the stride {self.stride} along each axis")
        self.has_bias = bool(has_bias)

    def check(self, x, w, *extras):
        if len(extras) != self.has_bias:
            raise TypeError(f"{self.label}: expected {2 + self.has_bias} input tensors, "
                            f"got {2 + len(extras)}")
        self.geometry = g = conv_transpose_geometry(
            self.label, x.shape, w.shape, self.stride, self.padding, self.output_padding,
            self.dilation, self.groups)
        c_out = g.c_in          # the adjoint convolution's input is this operator's output
        if self.has_bias and extras[0].shape != (c_out,):
            raise ShapeError(f"{self.label}: bias must have shape ({c_out},) (one per output "
                             f"channel), got {extras[0].shape}")

    def _forward(self, x, w, *extras):
        y = run_stage(self.device, self.geometry, "backward_data", x, w, *extras,
                      run=self._transpose)
        # x feeds gw and w feeds gx.
        need = self.needs_grad or (False, False)
        self.save(x=x if need[1] else None, w=w if need[0] else None)
        return y

    def _transpose(self, algorithm, x, w, *extras):
        """conv_transpose2d(x, w) + b with ``algorithm``'s backward_data, the bias fused or after."""
        g = self.geometry
        if self.has_bias and getattr(algorithm, "backward_data_fuses_bias", False):
            return algorithm.backward_data(g, x, w, bias=extras[0])
        y = algorithm.backward_data(g, x, w)
        return self.dispatch("epilogue", y, extras[0]) if self.has_bias else y

    forward_numpy = forward_cuda = _forward

    def epilogue_numpy(self, y, bias):
        # y is the forward's own new array: overwritten, as on the GPU.
        return epilogue_numpy(y, bias, None, 0, in_place=True)

    def epilogue_cuda(self, y, bias):
        return epilogue_cuda(y, bias, None, 0)

    def backward(self, grad_output):
        g = self.geometry
        saved = self.saved
        gy = grad_output.data
        need = self.needs_grad
        grads = [None, None]
        if need[0]:
            grads[0] = run_stage(self.device, g, "forward", gy, saved.w)
        if need[1]:
            grads[1] = run_stage(self.device, g, "backward_weight", gy, saved.x)
        if self.has_bias:
            grads.append(bias_grad(self.device, gy) if need[2] else None)
        return tuple(None if a is None else self.wrap(a) for a in grads)


def conv_transpose2d(x, w, b=None, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    """Transposed convolution of x [N, C_in, H, W] with w [C_in, C_out/groups, kh, kw].

    The adjoint of conv2d: ``<conv2d(u, w), v> == <u, conv_transpose2d(v, w)>``
    for every u, v of matching shapes. y is [N, C_out, OH, OW] with
    ``OH = (H - 1)*sh - top - bottom + dh*(kh - 1) + output_padding_h + 1``.
    ``stride``, ``dilation``, ``output_padding``: an int or (h, w);
    ``padding``: an int, (ph, pw) or (top, bottom, left, right), the rows
    and columns cut from the full output; ``output_padding`` < stride.
    ``b`` [C_out] is optional.
    """
    inputs = [x, w] if b is None else [x, w, b]
    return ConvTranspose2dOp(stride, padding, output_padding, dilation, groups,
                           has_bias=b is not None)(*inputs)
