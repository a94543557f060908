"""What the codec's exact transforms share: convolutions with integer weights whose sums
float64 computes exactly (:class:`ExactLayer`), and what their GPU kernels
(``cuda_src/exact_synthesis.cu``) need from Python.

The hyper-synthesis h_s (:mod:`gdnflow.codec.hyper_synthesis`, whose docstring gives the
arithmetic) and the image synthesis g_s (:mod:`gdnflow.codec.exact_image`) round every
weight of a layer to an integer multiple of 2^-e, with e chosen per layer so that each
sum of products of activations of at most a given number of bits stays below 2^53:
any summation order, with or without FMA, on any device, gives the same integers.
"""
import numpy as np

from gdnflow import ops
from gdnflow.autograd import no_grad
from gdnflow.backends import cuda
from gdnflow.nn.conv import ConvTranspose2d
from gdnflow.ops.conv.geometry import (conv_geometry, conv_transpose_geometry, int_tuple,
                                       normalize_padding)
from gdnflow.tensor import Tensor

#: The GPU kernels of both exact transforms.
SOURCE = "exact_synthesis.cu"
#: Bits of the largest weight of each layer (fewer for very wide layers: see weight_bits).
WEIGHT_BITS = 15
# Every partial sum of a layer stays below 2^52, and its bias below 2^51: under 2^53.
SUM_BITS, BIAS_LIMIT = 52, 2.0 ** 51
#: The most kernel taps of a transposed convolution that may reach one output in the GPU's
#: direct kernels (MAX_EXACT_TAPS there: they list them once per output; the kernels
#: finishing a GEMM's products, and NumPy, take any).
MAX_EXACT_TAPS = 25
#: Output channels per thread of the kernels finishing a layer from its GEMM's products
#: (EXACT_CHANNELS_PER_THREAD there).
CHANNELS_PER_THREAD = 4
#: Output channels per matrix product of a transposed layer on NumPy (ExactLayer): on the
#: synthesis's third layer (two cores) 8 took 0.38 s, 4, 16 and 128 0.42-0.46.
TRANSPOSED_GROUP = 8
#: Bytes of a float64.
FLOAT64_BYTES = np.dtype(np.float64).itemsize


def check_gpu_taps(layers):
    """Refuse (ValueError) a transposed layer among ``layers`` (ExactLayers) with more
    kernel taps reaching one output than the GPU kernels list (MAX_EXACT_TAPS)."""
    for layer in layers:
        if getattr(layer, "transpose", False) and layer.reaching_taps > MAX_EXACT_TAPS:
            raise ValueError(f"{layer.label}: {layer.reaching_taps} kernel taps reach each "
                             f"output; the GPU's exact kernels take at most {MAX_EXACT_TAPS} "
                             "(NumPy takes any)")


class DeviceConstants:
    """Host arrays a layer uploads to the GPU once, on first use: a subclass sets
    ``self._host_arrays`` (a tuple of float64 arrays); :meth:`device_arrays` gives them
    as GPU arrays."""

    _device_arrays = None

    def device_arrays(self):
        """The layer's constants as float64 GPU arrays, uploaded on first use."""
        if self._device_arrays is None:
            runtime = cuda.get_runtime()
            self._device_arrays = tuple(runtime.from_numpy(np.ascontiguousarray(a))
                                        for a in self._host_arrays)
        return self._device_arrays


def weight_bits(terms, activation_bits, name):
    """The weight bits a layer summing ``terms`` products of activations of at most
    ``activation_bits`` bits may use (at most WEIGHT_BITS); ``name`` its transform's."""
    bits = SUM_BITS - activation_bits - int(np.ceil(np.log2(terms)))
    if bits < 8:
        raise ValueError(f"{name}: a layer summing {terms} products is too wide for "
                         "exact float64 arithmetic")
    return min(WEIGHT_BITS, bits)


def phase_threads(shape):
    """The threads of a kernel that finishes a layer of ExactLayerShape ``shape`` (12 ints)
    from its GEMM's products: CHANNELS_PER_THREAD channels a thread, each output row's
    columns by phase, each phase padded to ceil(width / stride) (exact_phase_threads of
    exact_synthesis.cu, which says why)."""
    out_channels, out_height, out_width, stride_x = shape[3], shape[4], shape[5], shape[9]
    return (-(-out_channels // CHANNELS_PER_THREAD) * out_height * stride_x
            * -(-out_width // stride_x))


class ExactLayer(DeviceConstants):
    """One convolution with integer weights (see the module docstring).

    ``ExactLayer(layer, relu, fraction_bits, activation_bits, name)``: the convolution
    ``layer`` (a ReLU following where ``relu``) for inputs in units of
    2^-fraction_bits of at most ``activation_bits`` bits, in the transform ``name`` (for
    errors). :meth:`device_arrays` gives (weight, bias, weight rows) on the GPU, the
    rows a transposed layer's weight as (out * kh * kw, in) for its GEMM (a
    convolution's: (out, in * kh * kw)). Attributes: ``transpose`` (a transposed
    convolution), ``weight`` and ``bias`` (float64 integers), ``exponent`` e (weights
    are weight * 2^-e), ``stride``, ``padding``, ``output_padding``, ``relu`` (a ReLU
    follows), ``reaching_taps``, ``label`` (the layer, for errors), ``name``.
    """

    def __init__(self, layer, relu, fraction_bits, activation_bits, name):
        if layer.groups != 1 or layer.dilation not in (1, (1, 1)):
            raise ValueError(f"{name}: {layer!r} is grouped or dilated: not supported")
        self.transpose = isinstance(layer, ConvTranspose2d)
        self.name = name
        label = f"{name} {layer!r}"
        self.stride = int_tuple(label, "stride", layer.stride, 2, 1)
        self.output_padding = int_tuple(label, "output_padding",
                                        getattr(layer, "output_padding", 0), 2, 0)
        top, bottom, left, right = self.padding_box = normalize_padding(label, layer.padding)
        if top != bottom or left != right:
            raise ValueError(f"{label}: asymmetric padding {layer.padding} is not supported "
                             "(the GPU kernels pad rows and columns alike)")
        self.padding = (top, left)
        self.relu = relu
        weight = np.asarray(layer.weight.numpy(), np.float64)
        in_channels, kh, kw = weight.shape[0 if self.transpose else 1], *weight.shape[2:]
        #: Kernel taps reaching one output of a transposed layer (the GPU kernels' bound).
        self.reaching_taps = -(-kh // self.stride[0]) * -(-kw // self.stride[1])
        self.label = label
        bits = weight_bits(in_channels * kh * kw, activation_bits, name)
        largest = float(np.max(np.abs(weight)))
        # frexp: largest = m 2^k with 1/2 <= m < 1, so weight * 2^(bits - k) stays within 2^bits.
        self.exponent = bits - (np.frexp(largest)[1] if largest > 0 else 0)
        self.weight = np.rint(np.ldexp(weight, self.exponent))
        bias = np.zeros(weight.shape[1 if self.transpose else 0]) if layer.bias is None \
            else np.asarray(layer.bias.numpy(), np.float64)
        self.bias = np.clip(np.rint(np.ldexp(bias, self.exponent + fraction_bits)),
                            -BIAS_LIMIT, BIAS_LIMIT)
        rows = self.weight.transpose(1, 2, 3, 0).reshape(-1, in_channels) if self.transpose \
            else self.weight.reshape(len(self.weight), -1)
        self._host_arrays = (self.weight, self.bias, rows)
        # As NumPy-backend tensors once, not per tile.
        self._weight, self._bias = (Tensor(a, device="numpy", dtype=np.float64)
                                    for a in (self.weight, self.bias))

    def __call__(self, a):
        """The layer's exact output, in units of 2^-(exponent + fraction bits), for integers
        ``a`` (C, H, W) float64."""
        if self.transpose:
            y = self._transposed_sums(a)
        else:
            with no_grad():
                y = ops.conv2d(Tensor(a[None], device="numpy", dtype=np.float64), self._weight,
                               self._bias, stride=self.stride, padding=self.padding).numpy()[0]
        return np.maximum(y, 0.0) if self.relu else y

    def _transposed_sums(self, a):
        """A transposed layer's sums plus bias for ``a`` (C, H, W), as the GPU computes them:
        its weight rows times a, TRANSPOSED_GROUP output channels at a time, each tap's
        products added where they land (integers: the order does not matter). On two
        cores the exact decode took 11-12% less time this way than through the NumPy
        backend's float64 transposed convolution (benchmarks/results/exact_synthesis.md)."""
        rows = self._host_arrays[2]
        in_channels, height, width = a.shape
        out_channels, out_height, out_width = self.output_shape(a.shape)
        kh, kw = self.weight.shape[2:]
        (sy, sx), (py, px) = self.stride, self.padding
        # Every tap's landing place, before the padding is cropped.
        full = (max((height - 1) * sy + kh, out_height + py),
                max((width - 1) * sx + kw, out_width + px))
        out = np.empty((out_channels, out_height, out_width))
        inputs = a.reshape(in_channels, -1)
        for first in range(0, out_channels, TRANSPOSED_GROUP):
            last = min(out_channels, first + TRANSPOSED_GROUP)
            products = (rows[first * kh * kw:last * kh * kw] @ inputs).reshape(
                last - first, kh, kw, height, width)
            sums = np.zeros((last - first, *full))
            for ky in range(kh):
                for kx in range(kw):
                    sums[:, ky:ky + sy * height:sy, kx:kx + sx * width:sx] += products[:, ky, kx]
            out[first:last] = sums[:, py:py + out_height, px:px + out_width]
        out += self.bias[:, None, None]
        return out

    def output_shape(self, a_shape):
        """(channels, height, width) of the output for an input of shape ``a_shape`` (C, H, W)
        (the convolution operators' own geometry)."""
        x_shape, w_shape = (1, *a_shape), tuple(self.weight.shape)
        if self.transpose:      # the geometry of the convolution this one is the adjoint of
            g = conv_transpose_geometry(self.name, x_shape, w_shape, self.stride,
                                        self.padding_box, self.output_padding, (1, 1), 1)
            return g.c_in, g.h, g.w
        g = conv_geometry(self.name, x_shape, w_shape, self.stride, self.padding_box,
                          (1, 1), 1)
        return g.c_out, g.oh, g.ow

    def launch_shape(self, a_shape):
        """The ExactLayerShape struct's 12 ints for an input of shape ``a_shape`` (C, H, W)."""
        return (*a_shape, *self.output_shape(a_shape), *self.weight.shape[2:], *self.stride,
                *self.padding)
