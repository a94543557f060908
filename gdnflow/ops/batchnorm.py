"""Batch normalisation. CUDA kernels: ``cuda_src/batchnorm.cu``.

For x [N, C, *spatial] (NCHW images, or [N, C] features), per channel c,
with M = N * prod(spatial) values::

    training:   mean_c = (1/M) sum x,   var_c = (1/M) sum (x - mean_c)^2   (biased)
                running_mean <- (1 - momentum) running_mean + momentum mean_c
                running_var  <- (1 - momentum) running_var  + momentum var_c M/(M-1)
    inference:  mean_c, var_c = running_mean[c], running_var[c]

    xhat = (x - mean_c) / sqrt(var_c + eps),   y = gamma_c xhat + beta_c

(the running update is PyTorch's: the unbiased variance goes into the
running estimate, the biased one normalises the batch). Gradients, with
sums over the channel's M values::

    gbeta_c = sum gy,   ggamma_c = sum gy xhat
    training:   gx = gamma_c / sqrt(var_c + eps) * (gy - (gbeta_c + xhat ggamma_c) / M)
    inference:  gx = gamma_c / sqrt(var_c + eps) * gy

The running statistics are not inputs of the operator (no gradient flows to
them); they are tensors updated in place, like a Module's buffers.
:func:`fold_batch_norm` folds inference-mode batch norm into the preceding
convolution or linear layer.
"""
import math

import numpy as np

from gdnflow.autograd import Operator
from gdnflow.backends import cuda
from gdnflow.errors import DeviceMismatchError, ShapeError
from gdnflow.registry import register

SOURCE = "batchnorm.cu"
BN_BLOCK = 256                  # threads per block of the channel sums (-DBN_BLOCK)
BLOCKS_PER_SM = 4               # the channel sums aim at this many blocks per SM...
MIN_PER_BLOCK = 4 * BN_BLOCK    # ...as long as each block gets at least this many values
# Every kernel of the file is fetched with the same defines: one compiled module, not two.
DEFINES = (("BN_BLOCK", BN_BLOCK),)
cuda.declare_variants(SOURCE, DEFINES)


@register("batch_norm")
class BatchNormOp(Operator):
    """y = gamma * (x - mean) / sqrt(var + eps) + beta per channel; see the module docstring.

    Inputs: x [N, C, ...], gamma [C], beta [C]. ``running_mean`` and
    ``running_var`` ([C] tensors on x's device, or None) are read in
    inference and updated in place in training (skipped when None).
    """

    def __init__(self, running_mean, running_var, training, momentum=0.1, eps=1e-5):
        self.running_mean, self.running_var = running_mean, running_var
        self.training = bool(training)
        self.momentum, self.eps = float(momentum), float(eps)
        if not self.training and (running_mean is None or running_var is None):
            raise ValueError("batch_norm: inference mode (training=False) needs running_mean "
                             "and running_var")
        if (running_mean is None) != (running_var is None):
            raise ValueError("batch_norm: give both running_mean and running_var, or neither")
        if self.eps <= 0:
            raise ValueError(f"batch_norm: eps must be positive, got {eps}")

    def check(self, x, gamma, beta):
        if x.ndim < 2:
            raise ShapeError(f"{self.label}: input must be [N, C, ...] (at least 2-D), got "
                             f"shape {x.shape}")
        channels = x.shape[1]
        named = [("gamma", gamma), ("beta", beta)]
        if self.running_mean is not None:
            named += [("running_mean", self.running_mean), ("running_var", self.running_var)]
        for name, t in named:
            if t.shape != (channels,):
                raise ShapeError(f"{self.label}: {name} must have shape ({channels},) for an "
                                 f"input of shape {x.shape}, got {t.shape}")
            if t.device != x.device:
                raise DeviceMismatchError(f"{self.label}: {name} is on {t.device!r} but the "
                                          f"input is on {x.device!r}")
        self.count = x.shape[0] * math.prod(x.shape[2:])
        if self.training and self.count < 2:
            raise ShapeError(f"{self.label}: training needs more than one value per channel to "
                             f"estimate a variance, got input of shape {x.shape}")

    # ------------------------------------------------------------- NumPy --
    def forward_numpy(self, x, gamma, beta):
        axes = (0,) + tuple(range(2, x.ndim))
        per_channel = (1, -1) + (1,) * (x.ndim - 2)
        if self.training:
            mean = x.mean(axis=axes)
            var = np.mean(np.square(x - mean.reshape(per_channel)), axis=axes)
            if self.running_mean is not None:
                self._update_running_numpy(mean, var)
        else:
            mean = self.running_mean.data.astype(x.dtype)
            var = self.running_var.data.astype(x.dtype)
        invstd = 1 / np.sqrt(var + x.dtype.type(self.eps))
        y = ((x - mean.reshape(per_channel)) * (gamma * invstd).reshape(per_channel)
             + beta.reshape(per_channel))
        if self.recording:
            self.save(x=x, gamma=gamma, mean=mean, invstd=invstd)
        return y

    def _update_running_numpy(self, mean, var):
        m = self.momentum
        unbiased = var * (self.count / (self.count - 1))
        rm, rv = self.running_mean.data, self.running_var.data
        rm *= 1 - m                     # in place: the buffer tensors keep their arrays
        rm += (m * mean).astype(rm.dtype)
        rv *= 1 - m
        rv += (m * unbiased).astype(rv.dtype)

    def backward_numpy(self, gy):
        saved = self.saved
        x, gamma, mean, invstd = saved.x, saved.gamma, saved.mean, saved.invstd
        axes = (0,) + tuple(range(2, x.ndim))
        per_channel = (1, -1) + (1,) * (x.ndim - 2)
        xhat = (x - mean.reshape(per_channel)) * invstd.reshape(per_channel)
        gbeta = gy.sum(axis=axes)
        ggamma = (gy * xhat).sum(axis=axes)
        gx = None
        if self.needs_grad[0]:
            if self.training:
                gy = gy - (gbeta.reshape(per_channel) + xhat * ggamma.reshape(per_channel)) \
                    / gy.dtype.type(self.count)
            gx = gy * (gamma * invstd).reshape(per_channel)
        return gx, ggamma, gbeta

    # -------------------------------------------------------------- CUDA --
    def forward_cuda(self, x, gamma, beta):
        c = x.shape[1]
        l = math.prod(x.shape[2:])
        # mean, invstd and gamma * invstd per channel, in one allocation.
        coefficients = cuda.empty((3, c))
        mean, invstd, scale = (coefficients.offset(k * c, (c,)) for k in range(3))
        if self.training:
            partial, splits = _channel_sums("bn_stats_partial", x, x)
            update = self.running_mean is not None
            rm = self.running_mean.data.ptr if update else 0
            rv = self.running_var.data.ptr if update else 0
            cuda.kernel(SOURCE, "bn_stats_finalize", "P" * 8 + "iiiiffi", DEFINES).launch(
                c, partial.ptr, x.ptr, gamma.ptr, mean.ptr, invstd.ptr, scale.ptr, rm, rv,
                c, l, splits, self.count, self.momentum, self.eps, int(update))
        else:
            cuda.kernel(SOURCE, "bn_eval_coefficients", "PPPPPPif", DEFINES).launch(
                c, self.running_mean.data.ptr, self.running_var.data.ptr, gamma.ptr,
                mean.ptr, invstd.ptr, scale.ptr, c, self.eps)
        y = cuda.empty(x.shape)
        cuda.kernel(SOURCE, "bn_normalize", "PPPPPiii", DEFINES).launch(
            y.size, x.ptr, y.ptr, mean.ptr, scale.ptr, beta.ptr, c, l, y.size)
        if self.recording:
            self.save(x=x, coefficients=coefficients)
        return y

    def backward_cuda(self, gy):
        x, coefficients = self.saved.x, self.saved.coefficients
        c = x.shape[1]
        l = math.prod(x.shape[2:])
        mean, invstd, scale = (coefficients.offset(k * c, (c,)) for k in range(3))
        need = self.needs_grad
        gx = gbeta = ggamma = None
        if self.training or need[1] or need[2]:
            partial, splits = _channel_sums("bn_backward_partial", gy, x, mean)
            gbeta, ggamma = cuda.empty((c,)), cuda.empty((c,))
            cuda.kernel(SOURCE, "bn_backward_finalize", "PPPPii", DEFINES).launch(
                c, partial.ptr, invstd.ptr, gbeta.ptr, ggamma.ptr, c, splits)
        if need[0]:
            gx = cuda.empty(x.shape)
            # In inference the kernel reads neither the sums nor x: any valid
            # pointer stands in for the sums it was not given.
            gb, gg = (gbeta, ggamma) if gbeta is not None else (scale, scale)
            cuda.kernel(SOURCE, "bn_backward_data", "P" * 8 + "iiifi", DEFINES).launch(
                gx.size, gy.ptr, x.ptr, mean.ptr, invstd.ptr, scale.ptr, gb.ptr, gg.ptr,
                gx.ptr, c, l, gx.size, 1.0 / self.count, int(self.training))
        return gx, ggamma, gbeta

    def backward(self, grad_output):
        gx, ggamma, gbeta = self.dispatch("backward", grad_output.data)
        need = self.needs_grad
        return tuple(self.wrap(g) if g is not None and wanted else None
                     for g, wanted in zip((gx, ggamma, gbeta), need))


def _split_count(channels, count):
    """How many blocks share one channel's sums: enough blocks to fill the GPU, each busy."""
    target = BLOCKS_PER_SM * cuda.sm_count()
    return max(1, min(-(-target // channels), -(-count // MIN_PER_BLOCK)))


def _channel_sums(kernel, a, x, mean=None):
    """Launch a channel-sum kernel of batchnorm.cu; returns (partial [C, splits, 2], splits)."""
    n, c = x.shape[:2]
    l = math.prod(x.shape[2:])
    if c > 65535:
        raise ShapeError(f"batch_norm: at most 65535 channels on the GPU, got {c}")
    splits = _split_count(c, n * l)
    partial = cuda.empty((c, splits, 2))
    if mean is None:
        args = ("PPiii", a.ptr, partial.ptr)
    else:
        args = ("PPPPiii", a.ptr, x.ptr, mean.ptr, partial.ptr)
    cuda.kernel(SOURCE, kernel, args[0], DEFINES)(
        (splits, c, 1), (BN_BLOCK, 1, 1), *args[1:], n, c, l)
    return partial, splits


def batch_norm(x, gamma, beta, running_mean=None, running_var=None, training=False,
               momentum=0.1, eps=1e-5):
    """Batch normalisation of x [N, C, ...]: y = gamma (x - mean) / sqrt(var + eps) + beta.

    gamma, beta, running_mean, running_var are [C]. ``training``: mean and
    (biased) var over the batch and the spatial axes, and the running
    statistics (if given) updated in place with PyTorch's rule
    ``running = (1 - momentum) running + momentum batch`` (unbiased var).
    Otherwise the running statistics normalise. Differentiable in x, gamma
    and beta in both modes.
    """
    return BatchNormOp(running_mean, running_var, training, momentum, eps)(x, gamma, beta)


def fold_batch_norm(weight, bias, gamma, beta, mean, var, eps=1e-5):
    """Fold inference-mode batch norm into the layer before it; returns (weight', bias') in NumPy.

    ``weight`` is laid out [C_out, ...] (conv2d, depthwise, linear; not
    conv_transpose2d, whose output channels are its second axis), ``bias``
    [C_out] or None; the rest are [C_out]. With s = gamma / sqrt(var + eps)::

        weight'[o, ...] = weight[o, ...] * s[o]
        bias'[o]        = (bias[o] - mean[o]) * s[o] + beta[o]

    so that layer(x; weight', bias') = batch_norm(layer(x; weight, bias)).
    Accepts Tensors or arrays; computes in float64 and returns weight's dtype.
    """
    def host(a):
        return np.asarray(a.numpy() if hasattr(a, "numpy") else a, dtype=np.float64)
    w = host(weight)
    gamma, beta, mean, var = (host(a) for a in (gamma, beta, mean, var))
    b = np.zeros(w.shape[0]) if bias is None else host(bias)
    for name, a in (("bias", b), ("gamma", gamma), ("beta", beta), ("mean", mean), ("var", var)):
        if a.shape != (w.shape[0],):
            raise ShapeError(f"fold_batch_norm: {name} must have shape ({w.shape[0]},) for a "
                             f"weight of shape {w.shape}, got {a.shape}")
    s = gamma / np.sqrt(var + eps)
    dtype = np.asarray(weight.numpy() if hasattr(weight, "numpy") else weight).dtype
    folded_w = (w * s.reshape((-1,) + (1,) * (w.ndim - 1))).astype(dtype)
    folded_b = ((b - mean) * s + beta).astype(dtype)
    return folded_w, folded_b
