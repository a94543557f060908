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

from gdnflow.backends import cuda
from gdnflow.codec.exact_layers import SOURCE, ExactLayer, check_gpu_taps, phase_threads
from gdnflow.codec.gaussian_tables import scale_indexes
from gdnflow.codec.replayed_passes import ReplayedPasses
from gdnflow.codec.tiling import synthesis_crop, tile_ranges, total_stride
from gdnflow.nn.conv import Conv2d, ConvTranspose2d
from gdnflow.nn.layers import ReLU

#: Fractional bits of the activations (and of z_hat): a resolution of 2^-12.
FRACTION_BITS = 12
#: Largest |activation| in units of 2^-FRACTION_BITS: 2^24, i.e. 4096.0.
ACTIVATION_BITS = 24
ACTIVATION_LIMIT = 2.0 ** ACTIVATION_BITS
#: Side of the tiles of y's latents whose scales are computed at once on the host...
TILE_LATENTS = 64
#: ... and on the GPU (a 256-latent tile's float64 activations: about 70 MB at N = 128).
CUDA_TILE_LATENTS = 256
#: Bytes of a layer's GEMM buffers (column matrix and products, float64) up to which the
#: GPU computes its sums as one cuBLAS GEMM (:meth:`ExactHyperSynthesis._products`); a
#: 2048x1536 image's last layer needs 126 MiB; a full 256-latent tile's, 600 MiB, runs
#: the direct kernels.
GEMM_BYTES = 160 << 20
#: Input shapes whose GPU pass a hyper-synthesis keeps as a CUDA graph (with its buffers,
#: float64 products and columns: 30 MiB at 768x512, 238 MiB at 2048x1536), the least
#: recently used going first.
GRAPH_SHAPES = 2


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
                self.layers.append(ExactLayer(layer, relu, FRACTION_BITS, ACTIVATION_BITS,
                                              "hyper-synthesis"))
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
            weight, bias, _ = layer.device_arrays()
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
            check_gpu_taps(self.layers)
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
