"""The hyper-synthesis transform in exact integer arithmetic: scale indexes that
come out identical on every machine and device.

A hyperprior decoder must recompute, from the decoded side information z,
the scale of every element of y, and pick the same coding table as the
encoder did for it. Computed in floating point, h_s differs in the last bits
between a GPU and a CPU (or two CPUs: another summation order, FMA or not),
and a scale lying near the boundary between two table scales can then pick
another table: the decoder reads garbage from there on. CompressAI's codecs
have this failure; Ballé et al., "Integer networks for data compression with
latent-variable models" (ICLR 2019) fix it by computing the prior with
integers. gdnflow does the same for the codec, without retraining:

* every weight of a layer is rounded to an integer multiple of 2^-e (e per
  layer, so that the largest weight has :data:`WEIGHT_BITS` bits), every
  bias to a multiple of 2^-(e + F);
* the input z_hat = q_z + median and every activation after a ReLU are
  rounded to multiples of 2^-F (F = :data:`FRACTION_BITS`), clipped to
  +-:data:`ACTIVATION_LIMIT`;
* each layer's sum of products is then a sum of integers (in units of
  2^-(e + F)) whose every partial sum stays below 2^53 (checked per layer
  from its width), so float64 computes it exactly, in any order, with or
  without FMA, with any BLAS: the NumPy backend's float64 convolutions.

Rounding (half to even) and the power-of-two rescaling between layers are
exact IEEE operations, so the scales, and from them the table indexes
(:func:`gdnflow.codec.gaussian_tables.scale_indexes`), are a pure function of
the integers q_z and the checkpoint's weights. With F = 12 and 15-bit weights
the exact transform's scales differ from the float32 model's by 1.4e-4
relative (median; at most 3e-3, near the 0.11 bound), far below the table's 13%
spacing: 99.9% of the elements pick the table the float scales would (both
measured on the codec tests' small model, tests/codec/test_hyperprior_codec.py).

The transform runs tile by tile (:meth:`ExactHyperSynthesis.indexes`): each
tile of latents from the crop of z its receptive field reads
(:func:`gdnflow.codec.tiling.synthesis_crop`). The sums being exact, a tile's
scales are bit for bit the untiled ones, and memory is bounded by the tile.
On the host (``device="numpy"``, tiles of :data:`TILE_LATENTS`) the layers are
the NumPy backend's float64 convolutions (for a 768x512 image about 0.5 GMAC,
55 ms on two cores); on ``device="cuda"`` (tiles of :data:`CUDA_TILE_LATENTS`)
each layer is one cuBLAS float64 GEMM and a kernel of ``cuda_src/exact_synthesis.cu``
that finishes its sums (where its buffers fit :data:`GEMM_BYTES`), or that file's
direct kernels, and the last picks the table indexes there. From the second pass
over an input shape on, the pass is a CUDA graph's replay (:data:`GRAPH_SHAPES`
kept): at 768x512 on an H200 the round trip took 0.98 ms with the direct kernels,
0.42-0.66 with the GEMMs launched from Python, 0.25-0.34 replayed
(benchmarks/results/codec_speed_h200.md). Every path computes the same integers,
so all give the same indexes (tests/codec/test_hyper_synthesis_kernels.py checks it
bit for bit, with that file built for the host and on the GPU).
"""
import functools
import numpy as np

from gdnflow import ops
from gdnflow.autograd import no_grad
from gdnflow.backends import cuda
from gdnflow.codec.gaussian_tables import scale_indexes
from gdnflow.codec.replayed_passes import ReplayedPasses
from gdnflow.codec.tiling import synthesis_crop, tile_ranges, total_stride
from gdnflow.nn.conv import Conv2d, ConvTranspose2d
from gdnflow.ops.conv.geometry import (conv_geometry, conv_transpose_geometry, int_tuple,
                                       normalize_padding)
from gdnflow.nn.layers import ReLU
from gdnflow.tensor import Tensor

#: Fractional bits of the activations (and of z_hat): a resolution of 2^-12.
FRACTION_BITS = 12
#: Largest |activation| in units of 2^-FRACTION_BITS: 2^24, i.e. 4096.0.
ACTIVATION_BITS = 24
ACTIVATION_LIMIT = 2.0 ** ACTIVATION_BITS
#: Bits of the largest weight of each layer (fewer for very wide layers: see _weight_bits).
WEIGHT_BITS = 15
# Every partial sum of a layer stays below 2^52, and its bias below 2^51: under 2^53.
SUM_BITS, BIAS_LIMIT = 52, 2.0 ** 51
#: Side of the tiles of y's latents whose scales are computed at once on the host...
TILE_LATENTS = 64
#: ... and on the GPU (a 256-latent tile's float64 activations: about 70 MB at N = 128).
CUDA_TILE_LATENTS = 256
#: The GPU kernels (see the module docstring).
SOURCE = "exact_synthesis.cu"
#: Bytes of a layer's GEMM buffers (column matrix and products, float64) up to which the
#: GPU computes its sums as one cuBLAS GEMM (:meth:`ExactHyperSynthesis._products`); a
#: 2048x1536 image's last layer needs 126 MiB; a full 256-latent tile's, 600 MiB, runs
#: the direct kernels.
GEMM_BYTES = 160 << 20
#: Input shapes whose GPU pass a hyper-synthesis keeps as a CUDA graph (with its buffers,
#: float64 products and columns: 30 MiB at 768x512, 238 MiB at 2048x1536), the least
#: recently used going first.
GRAPH_SHAPES = 2
#: The most kernel taps of a transposed convolution that may reach one output on the GPU
#: (MAX_EXACT_TAPS in the kernels, which list them once per output; NumPy takes any).
MAX_EXACT_TAPS = 25


def _weight_bits(terms, activation_bits, name):
    """The weight bits a layer summing ``terms`` products of activations of at most
    ``activation_bits`` bits may use (at most WEIGHT_BITS); ``name`` its transform's."""
    bits = SUM_BITS - activation_bits - int(np.ceil(np.log2(terms)))
    if bits < 8:
        raise ValueError(f"{name}: a layer summing {terms} products is too wide for "
                         "exact float64 arithmetic")
    return min(WEIGHT_BITS, bits)


def phase_threads(shape):
    """The threads of a kernel that finishes a layer of ExactLayerShape ``shape`` (12 ints)
    from its GEMM's products: each output row's columns by phase, each phase padded to
    ceil(width / stride) (exact_phase_threads of exact_synthesis.cu, which says why)."""
    out_channels, out_height, out_width, stride_x = shape[3], shape[4], shape[5], shape[9]
    return out_channels * out_height * stride_x * -(-out_width // stride_x)


class ExactLayer:
    """One convolution with integer weights (see the module docstring).

    ``ExactLayer(layer, relu, fraction_bits=FRACTION_BITS, activation_bits=ACTIVATION_BITS,
    name="hyper-synthesis")``: the convolution ``layer`` (a ReLU following where
    ``relu``) for inputs in units of 2^-fraction_bits of at most ``activation_bits``
    bits, in the transform ``name`` (for errors; the synthesis g_s uses other bits:
    :mod:`gdnflow.codec.exact_image`). Attributes: ``transpose`` (a transposed
    convolution), ``weight`` and ``bias`` (float64 integers), ``exponent`` e (weights
    are weight * 2^-e), ``stride``, ``padding``, ``output_padding``, ``relu`` (a ReLU
    follows), ``reaching_taps``, ``label`` (the layer, for errors), ``name``.
    """

    def __init__(self, layer, relu, fraction_bits=FRACTION_BITS, activation_bits=ACTIVATION_BITS,
                 name="hyper-synthesis"):
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
        self._device_arrays = None
        self._groups = {}
        weight = np.asarray(layer.weight.numpy(), np.float64)
        in_channels, kh, kw = weight.shape[0 if self.transpose else 1], *weight.shape[2:]
        #: Kernel taps reaching one output of a transposed layer (the GPU kernels' bound).
        self.reaching_taps = -(-kh // self.stride[0]) * -(-kw // self.stride[1])
        self.label = label
        bits = _weight_bits(in_channels * kh * kw, activation_bits, name)
        largest = float(np.max(np.abs(weight)))
        # frexp: largest = m 2^k with 1/2 <= m < 1, so weight * 2^(bits - k) stays within 2^bits.
        self.exponent = bits - (np.frexp(largest)[1] if largest > 0 else 0)
        self.weight = np.rint(np.ldexp(weight, self.exponent))
        bias = np.zeros(weight.shape[1 if self.transpose else 0]) if layer.bias is None \
            else np.asarray(layer.bias.numpy(), np.float64)
        self.bias = np.clip(np.rint(np.ldexp(bias, self.exponent + fraction_bits)),
                            -BIAS_LIMIT, BIAS_LIMIT)
        # As NumPy-backend tensors once, not per tile.
        self._weight, self._bias = (Tensor(a, device="numpy", dtype=np.float64)
                                    for a in (self.weight, self.bias))

    def __call__(self, a):
        """The layer's exact output, in units of 2^-(exponent + fraction bits), for integer ``a``."""
        x = Tensor(a[None], device="numpy", dtype=np.float64)
        with no_grad():
            if self.transpose:
                y = ops.conv_transpose2d(x, self._weight, self._bias, stride=self.stride,
                                         padding=self.padding, output_padding=self.output_padding)
            else:
                y = ops.conv2d(x, self._weight, self._bias, stride=self.stride,
                               padding=self.padding)
        y = y.numpy()[0]
        return np.maximum(y, 0.0) if self.relu else y

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

    def device_arrays(self):
        """(weight, bias) as float64 GPU arrays, uploaded on first use."""
        if self._device_arrays is None:
            runtime = cuda.get_runtime()
            self._device_arrays = tuple(runtime.from_numpy(np.ascontiguousarray(a))
                                        for a in (self.weight, self.bias))
        return self._device_arrays

    def device_groups(self, group):
        """A transposed layer's weights by groups of ``group`` output channels, each a
        float64 GPU array (in_channels, count, kh, kw) (the GEMM of one group), and the
        bias (:mod:`gdnflow.codec.exact_image`); uploaded once per group size."""
        if group not in self._groups:
            runtime = cuda.get_runtime()
            weights = [runtime.from_numpy(np.ascontiguousarray(self.weight[:, first:first + group]))
                       for first in range(0, self.weight.shape[1], group)]
            self._groups[group] = (weights, self.device_arrays()[1])
        return self._groups[group]


class ExactHyperSynthesis:
    """h_s of a scale-hyperprior model in exact arithmetic: ``scales(q_z)`` (module docstring).

    ``ExactHyperSynthesis(h_s, medians, gemm_bytes=GEMM_BYTES, graph_shapes=GRAPH_SHAPES)``:
    ``h_s`` the model's Sequential of convolutions and ReLUs, ``medians`` z's
    entropy-bottleneck medians (float32, one per channel); on the GPU, a layer whose GEMM
    buffers take at most ``gemm_bytes`` runs as a float64 GEMM, a larger one as the direct
    kernels (0: always those), and the passes over ``graph_shapes`` input shapes are kept
    as CUDA graphs (0: none; a simulated device never replays). One object serves one
    thread at a time (a codec's).
    """

    def __init__(self, h_s, medians, gemm_bytes=GEMM_BYTES, graph_shapes=GRAPH_SHAPES):
        layers = list(h_s)
        self.layers = []
        for i, layer in enumerate(layers):
            if isinstance(layer, (Conv2d, ConvTranspose2d)):
                relu = i + 1 < len(layers) and isinstance(layers[i + 1], ReLU)
                self.layers.append(ExactLayer(layer, relu))
            elif not isinstance(layer, ReLU):
                raise ValueError(f"hyper-synthesis: cannot compute {layer!r} exactly")
        if not self.layers:
            raise ValueError("hyper-synthesis: no convolution to compute")
        self.modules = layers
        self._bounds = {}          # per table: its searched scales on the GPU
        self.gemm_bytes = gemm_bytes
        #: The passes kept as CUDA graphs, by input shape and table.
        self.replays = ReplayedPasses(graph_shapes)
        self.median_units = np.rint(np.ldexp(np.asarray(medians, np.float64), FRACTION_BITS))

    def scales(self, q_z):
        """The scales (M, h, w) float64 that h_s gives for integer side information q_z (N, h', w')."""
        a = self.input_units(q_z)
        *hidden, last = self.layers
        for layer in hidden:
            a = np.clip(np.rint(np.ldexp(layer(a), -layer.exponent)), -ACTIVATION_LIMIT,
                        ACTIVATION_LIMIT)
        return np.ldexp(last(a), -(last.exponent + FRACTION_BITS))

    def input_units(self, q_z):
        """The first layer's input for integer side information q_z: z_hat in units of
        2^-FRACTION_BITS, clipped."""
        a = np.ldexp(np.asarray(q_z, np.float64), FRACTION_BITS) + self.median_units[:, None, None]
        return np.clip(a, -ACTIVATION_LIMIT, ACTIVATION_LIMIT)

    def _launch_cuda_indexes(self, q_z, table, replayable=True):
        """The table indexes (a uint8 device array of its own) for integer q_z (N, h', w')
        from the float64 GPU kernels, in one pass (no tiles), launched: equal to
        :meth:`scales` then ``scale_indexes`` on the host. From the second pass over an
        input shape on (where ``replayable``: not one of several tiles), the pass is a CUDA
        graph's replay (:class:`~gdnflow.codec.replayed_passes.ReplayedPasses`; the eager
        pass launches 7 kernels and GEMMs from Python: 0.5 ms on the host at 768x512)."""
        units = np.ascontiguousarray(self.input_units(q_z))
        key = (units.shape, np.asarray(table, np.float64).tobytes())
        return self.replays.run(key, units, lambda a: self._gpu_pass(a, table), replayable)

    def _gpu_pass(self, a, table):
        """(indexes, launches, buffers) of one GPU pass over the device input ``a``: the
        uint8 result, the functions that launch each kernel and GEMM on it (they allocate
        nothing, so a CUDA graph may capture them), and every buffer they use (to be kept
        while they may run). Each layer's sums are a GEMM's where its buffers fit
        ``gemm_bytes`` (:meth:`_products`), else the direct kernels'."""
        runtime = cuda.get_runtime()
        launches, buffers = [], [a]
        last = self.layers[-1]
        for layer in self.layers:
            shape = layer.launch_shape(a.shape)
            # The 12 ints after the pointers are the ExactLayerShape struct.
            out = runtime.empty(shape[3:6], np.float64 if layer is not last else np.uint8)
            weight, bias = layer.device_arrays()
            products = self._products(layer, a, shape, launches, buffers)
            if layer is not last:
                flags = (int(layer.transpose), int(layer.relu), int(layer.exponent),
                         ACTIVATION_LIMIT)
                if products is None:
                    launch = functools.partial(cuda.kernel(
                        SOURCE, "exact_hidden_layer", "PPPPiiiiiiiiiiiiiiid").launch,
                        out.size, a.ptr, weight.ptr, bias.ptr, out.ptr, *shape, *flags)
                else:
                    launch = functools.partial(cuda.kernel(
                        SOURCE, "exact_hidden_from_products", "PPPiiiiiiiiiiiiiiid").launch,
                        phase_threads(shape), products.ptr, bias.ptr, out.ptr, *shape, *flags)
            else:
                bounds = self._device_bounds(table)
                flags = (int(layer.transpose), int(layer.relu),
                         int(layer.exponent) + FRACTION_BITS)
                if products is None:
                    launch = functools.partial(cuda.kernel(
                        SOURCE, "exact_last_layer", "PPPPPiiiiiiiiiiiiiiii").launch,
                        out.size, a.ptr, weight.ptr, bias.ptr, out.ptr, bounds.ptr,
                        bounds.size, *shape, *flags)
                else:
                    launch = functools.partial(cuda.kernel(
                        SOURCE, "exact_last_from_products", "PPPPiiiiiiiiiiiiiiii").launch,
                        phase_threads(shape), products.ptr, bias.ptr, out.ptr, bounds.ptr,
                        bounds.size, *shape, *flags)
            launches.append(launch)
            buffers.append(out)
            a = out
        return a, launches, buffers

    def _products(self, layer, a, shape, launches, buffers):
        """The buffer of ``layer``'s products as one float64 GEMM on the device input ``a``
        (its launches appended to ``launches``, its buffers to ``buffers``), or None where
        they would take more than ``gemm_bytes``: a convolution's sums [out, pixels] (its
        weight times the column matrix that ``exact_columns`` makes), a transposed
        convolution's per-tap products [out * kh * kw, input pixels] (its weight,
        transposed, times a), which the finishing kernels sum. Every product and sum is an
        integer below 2^53 (module docstring): cuBLAS's float64 GEMM computes them exactly,
        as the direct kernels do (4-10x faster on a hyperprior's layers on an H200)."""
        in_channels, in_height, in_width, out_channels, out_height, out_width, kh, kw = shape[:8]
        taps = kh * kw
        if layer.transpose:
            rows, columns, depth = out_channels * taps, in_height * in_width, in_channels
            needed = rows * columns
        else:
            rows, columns, depth = out_channels, out_height * out_width, in_channels * taps
            needed = (depth + rows) * columns
        if needed * np.dtype(np.float64).itemsize > self.gemm_bytes:
            return None
        runtime = cuda.get_runtime()
        weight = layer.device_arrays()[0]
        products = runtime.empty((rows, columns), np.float64)
        buffers.append(products)
        if layer.transpose:
            launches.append(functools.partial(cuda.matmul, weight.ptr, a.ptr, products.ptr,
                                              rows, columns, depth, trans_a=True,
                                              dtype=np.float64))
            return products
        matrix = runtime.empty((depth, columns), np.float64)
        buffers.append(matrix)
        launches.append(functools.partial(cuda.kernel(
            SOURCE, "exact_columns", "PiiiiiiiiiiiiP").launch, matrix.size, a.ptr, *shape,
            matrix.ptr))
        launches.append(functools.partial(cuda.matmul, weight.ptr, matrix.ptr, products.ptr,
                                          rows, columns, depth, dtype=np.float64))
        return products

    def _device_bounds(self, table):
        """The scales :func:`scale_indexes` searches (all but the last of ``table``) as a
        float64 GPU array, uploaded once per table."""
        key = np.asarray(table, np.float64).tobytes()
        if key not in self._bounds:
            self._bounds[key] = cuda.get_runtime().from_numpy(
                np.ascontiguousarray(table[:-1], np.float64))
        return self._bounds[key]

    def indexes(self, q_z, table, tile=None, device="numpy"):
        """Each element's coding-table index (uint8, the scales' shape) for ``table``
        (increasing scales, at most 256), computed tile by tile (module docstring) on
        ``device`` ("numpy" or "cuda": the same indexes); ``tile``: the tiles' side in
        latents (by default TILE_LATENTS on NumPy, CUDA_TILE_LATENTS on the GPU)."""
        return self.start_indexes(q_z, table, tile, device)()

    def start_indexes(self, q_z, table, tile=None, device="numpy"):
        """:meth:`indexes` started: a function that returns them. On the GPU the kernels of
        every tile are launched here and the function waits for them, so the host may work
        in between; on NumPy they are computed here."""
        if device not in ("numpy", "cuda"):
            raise ValueError(f"hyper-synthesis: unknown device {device!r} (numpy or cuda)")
        if len(table) > 256:
            raise ValueError(f"hyper-synthesis: {len(table)} table scales do not fit uint8 "
                             "indexes (at most 256)")
        if device == "cuda":
            for layer in self.layers:
                if layer.transpose and layer.reaching_taps > MAX_EXACT_TAPS:
                    raise ValueError(f"{layer.label}: {layer.reaching_taps} kernel taps reach "
                                     f"each output; the GPU's exact kernels take at most "
                                     f"{MAX_EXACT_TAPS} (NumPy takes any)")
        if tile is None:
            tile = CUDA_TILE_LATENTS if device == "cuda" else TILE_LATENTS
        q_z = np.asarray(q_z)
        upsampling = total_stride(self.modules)         # 4: y's latents per z element
        height, width = (upsampling * side for side in q_z.shape[1:])
        out = np.empty((self.layers[-1].bias.shape[0], height, width), np.uint8)
        launched = []       # (crop on the device, where it goes, its rows and columns there)
        single = len(tile_ranges(height, tile)) * len(tile_ranges(width, tile)) == 1
        for top, bottom in tile_ranges(height, tile):
            r0, r1 = synthesis_crop(self.modules, top, bottom, q_z.shape[1])
            for left, right in tile_ranges(width, tile):
                c0, c1 = synthesis_crop(self.modules, left, right, q_z.shape[2])
                r, c = upsampling * r0, upsampling * c0
                place = (slice(None), slice(top, bottom), slice(left, right))
                taken = (slice(None), slice(top - r, bottom - r), slice(left - c, right - c))
                if device == "cuda":
                    # Tiles of one shape would share a graph's result buffer: one tile only.
                    launched.append((self._launch_cuda_indexes(q_z[:, r0:r1, c0:c1], table,
                                                               replayable=single),
                                     place, taken))
                else:
                    out[place] = scale_indexes(self.scales(q_z[:, r0:r1, c0:c1]), table)[taken]

        def finish():
            for crop, place, taken in launched:
                out[place] = cuda.get_runtime().to_numpy(crop)[taken]
            return out
        return finish
