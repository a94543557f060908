"""The synthesis transform g_s in exact integer arithmetic: decoded images identical, byte
for byte, on NumPy and on the GPU.

A float32 synthesis rounds differently on a GPU and a CPU (summation order, FMA), so
the same file decodes to pixels that differ by a level where a value straddles a half.
:class:`ExactImageSynthesis` computes g_s as :mod:`gdnflow.codec.hyper_synthesis`
computes h_s, with integers held in float64, so that every device computes the same
numbers:

* each transposed convolution as there (:class:`~gdnflow.codec.exact_layers.ExactLayer`:
  weights of 15 bits, exact sums below 2^53), with activations in units of 2^-16
  (:data:`FRACTION_BITS`) clipped to +-256 (:data:`ACTIVATION_BITS` = 24 bits): the
  shipped models' activations stay below 11 on photos;
* each inverse GDN, y_i = x_i sqrt(beta_i + sum_j gamma_ij x_j^2), as: the squares
  x_j^2 rounded to units of 2^-16 (:data:`SQUARE_SHIFT`; below 2^32 of them), gamma
  rounded, each row at its own scale, to integers whose every row sums to at most 2^19
  (:data:`GAMMA_SUM_BITS`), so
  the norm's sum is an integer below 2^52 and exact in any order; then sqrt and the
  product with x, both correctly rounded in IEEE arithmetic, and the rounding to x's
  units;
* the last layer's value v in [0, 1] as the pixel round(255 v), halves up, through
  a rounding to 2^-32 that keeps the last products exact.

Nothing here adds a product that FMA could fuse into another rounding, so NumPy's and
the GPU's pixels are the same bytes (tests/codec/test_exact_image.py checks it bit for
bit, with ``cuda_src/exact_synthesis.cu`` built for the host and on the GPU). The
rounding of the weights, gammas and activations changes the pixels from the float32
synthesis's by a level here and there (measured on the shipped models:
benchmarks/results/exact_synthesis.md).

On NumPy the layers are the backend's float64 convolutions and one float64 matrix
product per inverse GDN. On the GPU each transposed layer is a cuBLAS float64 GEMM of
a few output channels at a time (their products within :data:`GEMM_BYTES`) finished by
a kernel, each inverse GDN a GEMM between two kernels; from the second pass over an
input shape on (up to :data:`GRAPH_PIXELS` pixels), the pass is a CUDA graph's replay.
"""
import functools

import numpy as np

from gdnflow.backends import cuda
from gdnflow.codec.exact_layers import (FLOAT64_BYTES, SOURCE, DeviceConstants, ExactLayer,
                                        phase_threads)
from gdnflow.codec.replayed_passes import ReplayedPasses
from gdnflow.nn.conv import ConvTranspose2d
from gdnflow.nn.gdn import GDN
from gdnflow.tensor import Tensor

NAME = "exact synthesis"
#: Fractional bits of the activations: a resolution of 2^-16.
FRACTION_BITS = 16
#: Largest |activation| in units of 2^-FRACTION_BITS: 2^24, i.e. 256.0.
ACTIVATION_BITS = 24
ACTIVATION_LIMIT = 2.0 ** ACTIVATION_BITS
#: An inverse GDN's squares are x^2 in units of 2^(SQUARE_SHIFT - 2 FRACTION_BITS) = 2^-16:
#: at most 2^(2 ACTIVATION_BITS - SQUARE_SHIFT) = 2^32 of them.
SQUARE_SHIFT = 16
#: Each row of an inverse GDN's integer gamma sums to at most 2^19: the norm's sums stay
#: below 2^19 2^32 = 2^51, and its beta below 2^51.
GAMMA_SUM_BITS, BETA_LIMIT = 19, 2.0 ** 51
#: The largest scale exponent of a norm: 2^-MAX_NORM_SHIFT times an integer below 2^53
#: is a normal float64 (no subnormals: scaling by a power of two stays exact).
MAX_NORM_SHIFT = 960
#: Fraction bits of a pixel's value before its scaling to 0..255 (EXACT_PIXEL_BITS).
PIXEL_BITS = 32
#: Bytes of a transposed layer's float64 products per GEMM on the GPU: the layer runs in
#: groups of output channels that fit (at 768x512 the third layer's 600 MiB: one group;
#: at 2048x1536, 8).
GEMM_BYTES = 640 << 20
#: Input shapes whose GPU pass is kept as a CUDA graph (with its buffers: 0.71 GiB at
#: 768x512), the least recently used going first...
GRAPH_SHAPES = 1
#: ... for images of at most this many pixels (larger ones run eagerly).
GRAPH_PIXELS = 1 << 20


def _exact_pixels(values, shift):
    """exact_pixel of ``exact_synthesis.cu`` on NumPy: uint8 of values in units of 2^-shift.
    (Scaling by a power of two is ldexp, exactly, and several times faster in NumPy.)"""
    v = np.clip(values * 2.0 ** -shift, 0.0, 1.0)
    r = np.rint(v * 2.0 ** PIXEL_BITS)
    return np.floor((r * 255.0 + 2.0 ** (PIXEL_BITS - 1)) * 2.0 ** -PIXEL_BITS).astype(np.uint8)


def _rounded_in_place(values, scale=None):
    """values (times ``scale``, a power of two, if given) rounded half to even and clipped
    to the activations' range, in place (exact_activation); returns ``values``."""
    if scale is not None:
        values *= scale
    np.rint(values, out=values)
    return np.clip(values, -ACTIVATION_LIMIT, ACTIVATION_LIMIT, out=values)


class ExactInverseGDN(DeviceConstants):
    """An inverse GDN with integer gamma and beta (module docstring).

    Attributes: ``gamma`` (C, C) and ``beta`` (C,) float64 integers, ``norm_shift`` (C,)
    int32 (channel i's norm n_i = (beta_i + gamma_i @ squares) 2^-norm_shift[i]),
    ``label``; :meth:`device_arrays` gives (gamma, beta, norm_shift) on the GPU.

    Each row has its own scale: trained gammas' row sums span up to 10^13 within a layer
    (the shipped models), and one scale for all would round the small rows to zeros.
    """

    def __init__(self, gdn):
        self.label = f"{NAME} {gdn!r}"
        if not gdn.inverse or gdn.simplified:
            raise ValueError(f"{self.label}: only the inverse, unsimplified GDN is computed "
                             "exactly")
        gamma = np.asarray(gdn.effective_gamma.numpy(), np.float64)
        beta = np.asarray(gdn.effective_beta.numpy(), np.float64)
        if (gamma < 0).any() or (beta < 0).any():
            raise ValueError(f"{self.label}: gamma and beta must not be negative")
        # Row i sums to below 2^(GAMMA_SUM_BITS - 1) before rounding, which adds at most
        # C/2; beta_i (below 2^k, k from frexp) to below 2^50 units, within BETA_LIMIT
        # rounded. A row of zeros with beta 0 takes the scale of 2^-MAX_NORM_SHIFT.
        row_sums = gamma.sum(axis=1)
        row_exponent = GAMMA_SUM_BITS - 1 - np.frexp(row_sums)[1]
        beta_exponent = 50 - np.frexp(beta)[1] - (2 * FRACTION_BITS - SQUARE_SHIFT)
        exponent = np.minimum(np.where(row_sums > 0, row_exponent, MAX_NORM_SHIFT),
                              np.where(beta > 0, beta_exponent, MAX_NORM_SHIFT))
        self.norm_shift = np.minimum(exponent + 2 * FRACTION_BITS - SQUARE_SHIFT,
                                     MAX_NORM_SHIFT).astype(np.int32)
        exponent = self.norm_shift - (2 * FRACTION_BITS - SQUARE_SHIFT)
        self.gamma = np.rint(np.ldexp(gamma, exponent[:, None]))
        self.beta = np.rint(np.ldexp(beta, self.norm_shift))
        if self.gamma.sum(axis=1).max() > 2.0 ** GAMMA_SUM_BITS or self.beta.max() > BETA_LIMIT:
            raise ValueError(f"{self.label}: gamma or beta out of the exact range")
        self._host_arrays = (self.gamma, self.beta, self.norm_shift)

    def __call__(self, x):
        """The rounded, clipped output for activations ``x`` (C, H, W) (exact_inverse_gdn)."""
        squares = np.multiply(x, x)
        squares *= 2.0 ** -SQUARE_SHIFT
        np.rint(squares, out=squares)
        norms = (self.gamma @ squares.reshape(len(squares), -1)).reshape(x.shape)
        norms += self.beta[:, None, None]
        norms *= np.ldexp(1.0, -self.norm_shift)[:, None, None]
        np.sqrt(norms, out=norms)
        norms *= x
        return _rounded_in_place(norms)


class ExactImageSynthesis:
    """g_s in exact arithmetic: ``pixels(y_hat)`` on NumPy, ``device_pixels`` on the GPU.

    ``ExactImageSynthesis(g_s, gemm_bytes=GEMM_BYTES, graph_shapes=GRAPH_SHAPES)``:
    ``g_s`` a Sequential of transposed convolutions, each but the last followed by an
    inverse GDN (both shipped architectures' synthesis); anything else is refused with
    a ValueError. One object serves one thread at a time (a codec's).
    """

    def __init__(self, g_s, gemm_bytes=GEMM_BYTES, graph_shapes=GRAPH_SHAPES):
        self.steps = []
        for module in g_s:
            if isinstance(module, ConvTranspose2d):
                self.steps.append(ExactLayer(module, False, FRACTION_BITS, ACTIVATION_BITS,
                                             NAME))
            elif isinstance(module, GDN):
                self.steps.append(ExactInverseGDN(module))
            else:
                raise ValueError(f"{NAME}: cannot compute {module!r} exactly (transposed "
                                 "convolutions and inverse GDNs only)")
        if not self.steps or not isinstance(self.steps[-1], ExactLayer):
            raise ValueError(f"{NAME}: the synthesis must end with a transposed convolution")
        self.gemm_bytes = gemm_bytes
        #: The passes kept as CUDA graphs, by input shape.
        self.replays = ReplayedPasses(graph_shapes)

    def pixels(self, y_hat):
        """uint8 (H, W, channels): the image of y_hat (M, h, w) (float32), on NumPy."""
        x = self.input_units(y_hat)
        *hidden, last = self.steps
        for step in hidden:
            x = (_rounded_in_place(step(x), 2.0 ** -step.exponent) if isinstance(step, ExactLayer)
                 else step(x))
        values = last(x)
        return np.ascontiguousarray(
            _exact_pixels(values, last.exponent + FRACTION_BITS).transpose(1, 2, 0))

    @staticmethod
    def input_units(y_hat):
        """The first layer's input: y_hat in units of 2^-FRACTION_BITS, rounded, clipped."""
        return _rounded_in_place(np.asarray(y_hat, np.float32).astype(np.float64),
                                 2.0 ** FRACTION_BITS)

    def device_pixels(self, y_hat, replayable=True):
        """The uint8 (H, W, channels) image of the float32 device array ``y_hat``
        (M, h, w), as a device array of its own, launched (equal to :meth:`pixels`). From
        the second pass over a shape on (where ``replayable`` and the image has at most
        GRAPH_PIXELS pixels), a CUDA graph's replay."""
        return self.replays.run(tuple(y_hat.shape), y_hat, self._gpu_pass,
                                replayable and self.replayable_shape(y_hat.shape))

    def replayable_shape(self, y_shape):
        """Whether the GPU pass over latents of ``y_shape`` (M, h, w) may be kept as a CUDA
        graph: an image of at most GRAPH_PIXELS pixels."""
        _, height, width = self._shapes(y_shape)[-1][3:6]
        return height * width <= GRAPH_PIXELS

    def tile_pixels(self, y_hat, device, whole=True):
        """The uint8 (H, W, channels) host image of a codec's tile on ``device`` ("numpy" or
        "cuda"): ``y_hat`` its (M, h, w) float32 latents, or on a GPU a one-tile image's
        cuda Tensor (1, M, h, w); the GPU pass is replayed where ``whole`` (one tile)."""
        if device != "cuda":
            return self.pixels(y_hat)
        runtime = cuda.get_runtime()
        if isinstance(y_hat, Tensor):
            y_hat = y_hat.data.reshape(y_hat.shape[1:])
        else:
            y_hat = runtime.from_numpy(np.ascontiguousarray(y_hat, np.float32))
        return runtime.to_numpy(self.device_pixels(y_hat, replayable=whole))

    def _shapes(self, y_shape):
        """Each transposed layer's ExactLayerShape (12 ints) for latents of ``y_shape``."""
        shapes, a_shape = [], tuple(y_shape)
        for step in self.steps:
            if isinstance(step, ExactLayer):
                shapes.append(step.launch_shape(a_shape))
                a_shape = shapes[-1][3:6]
        return shapes

    def _group(self, shape):
        """Output channels per GEMM of the transposed layer of ExactLayerShape ``shape``."""
        out_channels, taps, in_plane = shape[3], shape[6] * shape[7], shape[1] * shape[2]
        return max(1, min(out_channels, self.gemm_bytes // (taps * in_plane * FLOAT64_BYTES)))

    def _gpu_pass(self, y_hat):
        """(pixels, launches, buffers) of one GPU pass over the device ``y_hat``
        (:class:`~gdnflow.codec.replayed_passes.ReplayedPasses`)."""
        runtime = cuda.get_runtime()
        shapes = self._shapes(y_hat.shape)
        # One scratch buffer (the operations run one after another on one stream): each
        # layer's products, then each inverse GDN's squares and norms (600 MiB of the
        # 0.71 GiB a 768x512 pass holds).
        activations = max(int(np.prod(shape[3:6])) for shape in shapes)
        products = max(self._group(shape) * shape[6] * shape[7] * shape[1] * shape[2]
                       for shape in shapes)
        scratch = runtime.empty((max(2 * activations, products),), np.float64)
        x = runtime.empty(tuple(y_hat.shape), np.float64)
        launches = [functools.partial(
            cuda.kernel(SOURCE, "exact_input_units", "PPiid").launch, x.size, y_hat.ptr, x.ptr,
            x.size, FRACTION_BITS, ACTIVATION_LIMIT)]
        buffers = [y_hat, scratch, x]
        shapes = iter(shapes)
        for step in self.steps:
            if isinstance(step, ExactInverseGDN):
                self._inverse_gdn(step, x, scratch.ptr, scratch.ptr + x.size * FLOAT64_BYTES,
                                  launches)
                continue
            shape = next(shapes)
            last = step is self.steps[-1]
            out = runtime.empty((*shape[4:6], shape[3]) if last else shape[3:6],
                                np.uint8 if last else np.float64)
            buffers.append(out)
            self._transposed(step, x, shape, out, last, scratch.ptr, launches)
            x = out
        return x, launches, buffers

    def _inverse_gdn(self, step, x, squares, norms, launches):
        """Launches of an inverse GDN of ``x`` (C, H, W) in place, through the float64
        buffers at the device addresses ``squares`` and ``norms`` (x's size each)."""
        channels, plane = x.shape[0], x.shape[1] * x.shape[2]
        gamma, beta, norm_shift = step.device_arrays()
        launches.append(functools.partial(
            cuda.kernel(SOURCE, "exact_squares", "PPii").launch, x.size, x.ptr, squares,
            x.size, SQUARE_SHIFT))
        launches.append(functools.partial(cuda.matmul, gamma.ptr, squares, norms,
                                          channels, plane, channels, dtype=np.float64))
        launches.append(functools.partial(
            cuda.kernel(SOURCE, "exact_inverse_gdn", "PPPPiid").launch, x.size, x.ptr,
            norms, beta.ptr, norm_shift.ptr, channels, plane, ACTIVATION_LIMIT))

    def _transposed(self, step, x, shape, out, last, products, launches):
        """Launches of the transposed layer ``step`` from ``x`` into ``out``: per group of
        output channels (:meth:`_group`), a GEMM of their weight rows (consecutive) with x
        into the float64 buffer at the device address ``products``, then the finishing
        kernel of that group (activations, or the last layer's pixels)."""
        in_channels, in_height, in_width, out_channels = shape[:4]
        taps, in_plane = shape[6] * shape[7], in_height * in_width
        out_plane = shape[4] * shape[5]
        group = self._group(shape)
        _, bias, rows = step.device_arrays()     # rows: (out * kh * kw, in)
        for first in range(0, out_channels, group):
            count = min(group, out_channels - first)
            group_shape = (*shape[:3], count, *shape[4:])
            launches.append(functools.partial(
                cuda.matmul, rows.ptr + first * taps * in_channels * FLOAT64_BYTES, x.ptr,
                products, count * taps, in_plane, in_channels, dtype=np.float64))
            bias_ptr = bias.ptr + first * FLOAT64_BYTES
            if last:
                launches.append(functools.partial(
                    cuda.kernel(SOURCE, "exact_pixels_from_products",
                                "PPPiiiiiiiiiiiiiii").launch,
                    phase_threads(group_shape), products, bias_ptr, out.ptr, *group_shape,
                    first, out_channels, step.exponent + FRACTION_BITS))
            else:
                launches.append(functools.partial(
                    cuda.kernel(SOURCE, "exact_hidden_from_products",
                                "PPPiiiiiiiiiiiiiiid").launch,
                    phase_threads(group_shape), products, bias_ptr,
                    out.ptr + first * out_plane * FLOAT64_BYTES, *group_shape, 1, 0,
                    step.exponent, ACTIVATION_LIMIT))
