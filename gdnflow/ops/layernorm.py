"""Layer normalisation over the last axes. CUDA kernels: ``cuda_src/layer_norm.cu``.

For x of any shape, normalised over its axes ``axis`` ... last (their
product: cols values a row, rows = the product of the others), with scale
and bias of the normalised axes' shape::

    mean = (1/cols) sum x,   var = (1/cols) sum (x - mean)^2   (biased)
    xhat = (x - mean) / sqrt(var + eps),   y = xhat scale + bias

Gradients, with g = gy scale and means over each row::

    gx = (g - mean(g) - xhat mean(g xhat)) / sqrt(var + eps)
    gscale = sum over rows of gy xhat,   gbias = sum over rows of gy

ONNX's ``LayerNormalization`` and Keras's ``LayerNormalization`` (over the
last axes) map here; ConvNeXt's block has one after each depthwise
convolution. Computed in float32 (``autocast`` "float32").

``channels_first=True`` takes x as [N, C, spatial...] and computes the layer
norm over C of x moved to channels last, [N, spatial..., C]: what the
exported ConvNeXt block computes with a transpose first, in one pass (the
inference plans fuse the pair, :func:`gdnflow.inference.passes.fuse_transposed_layer_norms`).
Its CUDA backward moves x and the gradient with transposes around the
row kernels. ``channels_out_first=True`` (with ``channels_first``) also
writes y back as [N, C, spatial...]: torchvision's ``LayerNorm2d`` (a
transpose, the layer norm, the transpose back) in one pass.
"""
import math

import numpy as np

from gdnflow.autograd import Operator
from gdnflow.backends import cuda
from gdnflow.errors import ShapeError
from gdnflow.ops.shape import cuda_transpose
from gdnflow.registry import register

SOURCE = "layer_norm.cu"
ROWS_PER_BLOCK = 8      # warps per block of the row kernels (layer_norm.cu)
PARAMETER_ROWS = 8      # threadIdx.y extent of layer_norm_backward_params
TILE, TILE_ROWS = 32, 8  # the channels-first kernel's block (32 positions x 8 thread rows)


@register("layer_norm")
class LayerNormOp(Operator):
    """y = (x - mean) / sqrt(var + eps) * scale + bias over x's axes ``axis`` ... last.

    Inputs: x, scale and bias (each of shape ``x.shape[axis:]``).
    """

    def __init__(self, axis=-1, eps=1e-5, channels_first=False, channels_out_first=False):
        self.axis, self.eps, self.channels_first = int(axis), float(eps), bool(channels_first)
        self.channels_out_first = bool(channels_out_first)
        if not self.eps > 0:
            raise ValueError(f"layer_norm: eps must be positive, got {eps}")
        if self.channels_first and self.axis != -1:
            raise ValueError(f"layer_norm: channels_first normalises the channels alone "
                             f"(axis -1 of the channels-last tensor), got axis {axis}")
        if self.channels_out_first and not self.channels_first:
            raise ValueError("layer_norm: channels_out_first writes a channels_first layer "
                             "norm's result channels first; it needs channels_first=True")

    def check(self, x, scale, bias):
        if self.channels_first:
            if x.ndim < 2 or scale.shape != (x.shape[1],) or bias.shape != (x.shape[1],):
                raise ShapeError(f"{self.label}: channels_first takes x [N, C, ...] and scale "
                                 f"and bias [C]; got x {x.shape}, scale {scale.shape}, bias "
                                 f"{bias.shape}")
            self.cols, self.rows = x.shape[1], x.size // x.shape[1] if x.shape[1] else 0
            self.moved_shape = (x.shape[0],) + x.shape[2:] + (x.shape[1],)
            self.out_shape = x.shape if self.channels_out_first else self.moved_shape
            return
        if not -x.ndim <= self.axis < x.ndim:
            raise ShapeError(f"{self.label}: axis {self.axis} is out of range for an input of "
                             f"shape {x.shape}")
        normalized = x.shape[self.axis % x.ndim:]
        for name, t in (("scale", scale), ("bias", bias)):
            if t.shape != normalized:
                raise ShapeError(f"{self.label}: {name} must have the normalised axes' shape "
                                 f"{normalized} for an input of shape {x.shape}, got {t.shape}")
        self.cols = math.prod(normalized)
        self.rows = x.size // self.cols if self.cols else 0

    # ------------------------------------------------------------- NumPy --
    def _channels_last(self, x):
        """x moved to channels last (channels_first) or x, as a NumPy array."""
        return np.moveaxis(x, 1, -1) if self.channels_first else x

    def forward_numpy(self, x, scale, bias):
        x = self._channels_last(x)
        rows = x.reshape(self.rows, self.cols)
        mean = rows.mean(axis=1, keepdims=True)
        centred = rows - mean
        inv = 1 / np.sqrt(np.mean(centred * centred, axis=1, keepdims=True)
                          + x.dtype.type(self.eps))
        xhat = centred * inv
        if self.recording:
            self.save(xhat=xhat, inv=inv, scale=scale)
        y = (xhat * scale.reshape(-1) + bias.reshape(-1)).reshape(x.shape)
        return np.ascontiguousarray(np.moveaxis(y, -1, 1)) if self.channels_out_first else y

    def backward_numpy(self, gy):
        xhat, inv, scale = self.saved.xhat, self.saved.inv, self.saved.scale
        if self.channels_out_first:
            gy = np.moveaxis(gy, 1, -1)
        gy = gy.reshape(self.rows, self.cols)
        g = gy * scale.reshape(-1)
        gx = inv * (g - g.mean(axis=1, keepdims=True)
                    - xhat * (g * xhat).mean(axis=1, keepdims=True))
        if self.channels_first:
            gx = np.moveaxis(gx.reshape(self.moved_shape), -1, 1)
        return (gx.reshape(self.input_shapes[0]), (gy * xhat).sum(axis=0).reshape(scale.shape),
                gy.sum(axis=0).reshape(scale.shape))

    # -------------------------------------------------------------- CUDA --
    def forward_cuda(self, x, scale, bias):
        y = cuda.empty(self.out_shape if self.channels_first else x.shape)
        statistics = cuda.empty((2, self.rows))        # mean and 1/std per row
        mean, inv = (statistics.offset(k * self.rows, (self.rows,)) for k in range(2))
        if self.rows and self.channels_first:
            spatial = self.rows // x.shape[0]
            cuda.kernel(SOURCE, "layer_norm_channels_first_forward", "PPPPPPiifi")(
                (-(-spatial // TILE) * x.shape[0], 1, 1), (TILE, TILE_ROWS, 1), x.ptr, scale.ptr,
                bias.ptr, y.ptr, mean.ptr, inv.ptr, self.cols, spatial, self.eps,
                int(self.channels_out_first))
        elif self.rows:
            cuda.kernel(SOURCE, "layer_norm_forward", "PPPPPPiif").launch(
                self.rows * 32, x.ptr, scale.ptr, bias.ptr, y.ptr, mean.ptr, inv.ptr,
                self.rows, self.cols, self.eps, block=32 * ROWS_PER_BLOCK)
        if self.recording:
            self.save(x=x, scale=scale, statistics=statistics)
        return y

    def backward_cuda(self, gy):
        x, scale, statistics = self.saved.x, self.saved.scale, self.saved.statistics
        if self.channels_first:
            # The row kernels on x (and a channels-first gy) moved to channels last; gx
            # moved back.
            to_last = (0,) + tuple(range(2, x.ndim)) + (1,)
            x = cuda_transpose(x, to_last)
            if self.channels_out_first:
                gy = cuda_transpose(gy, to_last)
        mean, inv = (statistics.offset(k * self.rows, (self.rows,)) for k in range(2))
        gx = cuda.empty(x.shape)
        gscale, gbias = cuda.zeros(scale.shape), cuda.zeros(scale.shape)
        if self.rows:
            cuda.kernel(SOURCE, "layer_norm_backward_data", "PPPPPPii").launch(
                self.rows * 32, x.ptr, gy.ptr, scale.ptr, mean.ptr, inv.ptr, gx.ptr,
                self.rows, self.cols, block=32 * ROWS_PER_BLOCK)
            column_tiles = -(-self.cols // 32)
            # Enough row shares to give every SM a few blocks, each at least 64 rows.
            shares = max(1, min(-(-4 * cuda.sm_count() // column_tiles), self.rows // 64, 65535))
            cuda.kernel(SOURCE, "layer_norm_backward_params", "PPPPPPii")(
                (column_tiles, shares, 1), (32, PARAMETER_ROWS, 1), x.ptr, gy.ptr, mean.ptr,
                inv.ptr, gscale.ptr, gbias.ptr, self.rows, self.cols)
        if self.channels_first:
            gx = cuda_transpose(gx, (0, gx.ndim - 1) + tuple(range(1, gx.ndim - 1)))
        return gx, gscale, gbias

    def backward(self, grad_output):
        return tuple(self.wrap(g) if wanted else None for g, wanted in
                     zip(self.dispatch("backward", grad_output.data), self.needs_grad))


def layer_norm(x, scale, bias, axis=-1, eps=1e-5):
    """Normalise ``x`` over its axes ``axis`` ... last, then scale and shift (module
    docstring); ``scale`` and ``bias`` have the normalised axes' shape."""
    return LayerNormOp(axis, eps)(x, scale, bias)
