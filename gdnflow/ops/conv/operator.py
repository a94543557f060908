"""The conv2d operator: y = act(conv(x, w) + b + residual), on NumPy and CUDA.

The formula and output size are :mod:`gdnflow.ops.conv.geometry`'s; the maps
run by the algorithm :func:`~gdnflow.ops.conv.planning.conv_algorithm` picks
(the NumPy reference on the CPU); bias, residual and activation are fused
into the algorithm's forward where it can, else one epilogue pass after it
(:mod:`gdnflow.ops.conv.epilogue`).
"""
from gdnflow.autograd import Operator
from gdnflow.errors import ShapeError
from gdnflow.ops.conv.epilogue import (activation_grad_cuda, activation_grad_numpy, bias_grad,
                                       epilogue_cuda, epilogue_numpy)
from gdnflow.ops.conv.geometry import ACTIVATIONS, conv_geometry, conv_parameters
from gdnflow.ops.conv.planning import run_stage
from gdnflow.registry import register


@register("conv2d")
class Conv2dOp(Operator):
    """y = act(conv(x, w) + b + residual); the formula: :mod:`gdnflow.ops.conv.geometry`.

    Inputs: x [N, C_in, H, W], w [C_out, C_in/groups, kh, kw], then the
    optional b [C_out] and residual [N, C_out, OH, OW] in that order (the
    constructor says which are present). ``activation`` (None, "relu",
    "relu6") and the residual are applied in the same pass as the bias (one
    kernel after a GEMM; inside the depthwise kernel). The fused activation
    is differentiable: its gradient is taken from the saved output y (relu
    passes where y > 0, relu6 where 0 < y < 6), so training through a fused
    conv + bias + ReLU6 costs one more saved tensor and no extra pass.

    On 16-bit tensors (and under :func:`gdnflow.autocast`, which rounds
    float32 inputs to 16 bits: ``autocast = "lower"``) each stage runs as
    16-bit GEMMs or the 16-bit depthwise forward where
    :func:`~gdnflow.ops.conv.planning.half_conv_algorithm` has an algorithm for
    it, else in float32 with its result rounded once (the depthwise backward;
    and always on NumPy, the emulation): :func:`~gdnflow.ops.conv.planning.run_stage`.
    """

    autocast = "lower"

    def __init__(self, stride=1, padding=0, dilation=1, groups=1, activation=None,
                 has_bias=False, has_residual=False):
        self.stride, self.padding, self.dilation, self.groups = conv_parameters(
            "conv2d", stride, padding, dilation, groups)
        try:
            self.activation = ACTIVATIONS[activation]
        except (KeyError, TypeError):
            names = [a for a in ACTIVATIONS if a]
            raise ValueError(f"conv2d: activation must be one of {names} or None, "
                             f"got {activation!r}") from None
        self.has_bias, self.has_residual = bool(has_bias), bool(has_residual)

    def check(self, x, w, *extras):
        expected = 2 + self.has_bias + self.has_residual
        if 2 + len(extras) != expected:
            raise TypeError(f"{self.label}: expected {expected} input tensors, "
                            f"got {2 + len(extras)}")
        self.geometry = g = conv_geometry(self.label, x.shape, w.shape, self.stride,
                                          self.padding, self.dilation, self.groups)
        if self.has_bias and extras[0].shape != (g.c_out,):
            raise ShapeError(f"{self.label}: bias must have shape ({g.c_out},) (one per output "
                             f"channel), got {extras[0].shape}")
        if self.has_residual and extras[-1].shape != g.y_shape:
            raise ShapeError(f"{self.label}: residual must have the output's shape {g.y_shape}, "
                             f"got {extras[-1].shape}")

    def _forward(self, x, w, *extras):
        y = run_stage(self.device, self.geometry, "forward", x, w, *extras, run=self._convolve)
        # x feeds gw and w feeds gx; y gives the fused activation's gradient.
        need = self.needs_grad or (False, False)
        self.save(x=x if need[1] else None, w=w if need[0] else None,
                  y=y if self.recording and self.activation else None)
        return y

    def _convolve(self, algorithm, x, w, *extras):
        """act(conv(x, w) + bias + residual) with ``algorithm``, its epilogue fused or after."""
        g = self.geometry
        bias = extras[0] if self.has_bias else None
        residual = extras[-1] if self.has_residual else None
        fused = algorithm.fuses_bias_activation and (
            residual is None or getattr(algorithm, "fuses_residual", False))
        if fused and residual is not None:
            y = algorithm.forward(g, x, w, bias, self.activation, residual=residual)
        else:
            y = algorithm.forward(g, x, w, bias if fused else None,
                                  self.activation if fused else 0)
        if not fused and (bias is not None or residual is not None or self.activation):
            y = self.dispatch("epilogue", y, bias, residual, self.activation)
        return y

    forward_numpy = forward_cuda = _forward

    def epilogue_numpy(self, y, bias, residual, activation):
        # y is the forward's own new array: overwritten, as on the GPU.
        return epilogue_numpy(y, bias, residual, activation, in_place=True)

    def epilogue_cuda(self, y, bias, residual, activation):
        return epilogue_cuda(y, bias, residual, activation)

    def activation_grad_numpy(self, gy, y):
        return activation_grad_numpy(gy, y, self.activation)

    def activation_grad_cuda(self, gy, y):
        return activation_grad_cuda(gy, y, self.activation)

    def backward(self, grad_output):
        saved = self.saved
        gz = grad_output.data
        if self.activation:
            gz = self.dispatch("activation_grad", gz, saved.y)
        need = self.needs_grad
        gx = gw = None
        if need[0]:
            gx = run_stage(self.device, self.geometry, "backward_data", gz, saved.w)
        if need[1]:
            gw = run_stage(self.device, self.geometry, "backward_weight", saved.x, gz)
        grads = [gx, gw]
        if self.has_bias:
            grads.append(bias_grad(self.device, gz) if need[2] else None)
        if self.has_residual:
            grads.append(gz if need[-1] else None)
        return tuple(None if a is None else self.wrap(a) for a in grads)


def conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, activation=None,
           residual=None):
    """2-D convolution (cross-correlation) of x [N, C_in, H, W] with w [C_out, C_in/groups, kh, kw].

    ``y[n, o, p, q] = act(b[o] + residual[n, o, p, q] + sum_{c,i,j} w[o, c, i, j]
    * x[n, g*C_in/groups + c, p*sh - top + i*dh, q*sw - left + j*dw])``, g the
    group of o, zeros outside the input; y is [N, C_out, OH, OW] with
    ``OH = floor((H + top + bottom - dh*(kh-1) - 1)/sh) + 1`` (OW likewise).

    ``stride``, ``dilation``: an int or (h, w). ``padding``: an int, (ph, pw)
    or (top, bottom, left, right). ``groups`` must divide C_in and C_out;
    groups == C_in == C_out is a depthwise convolution. ``b`` [C_out] and
    ``residual`` (y's shape) are optional; ``activation`` is None, "relu" or
    "relu6". The bias, residual and activation are fused into one pass after
    the convolution and remain differentiable (see :class:`Conv2dOp`).
    """
    inputs = [t for t in (x, w, b, residual) if t is not None]
    return Conv2dOp(stride, padding, dilation, groups, activation,
                  has_bias=b is not None, has_residual=residual is not None)(*inputs)
