"""Generalized divisive normalization: GDN, inverse GDN and their simplified forms.

CUDA kernels: ``cuda_src/gdn.cu``; the channel sums are cuBLAS SGEMMs
through :mod:`gdnflow.backends.cuda.blas`.

Forward
-------
Per pixel (image n, row h, column w), over the channels of an NCHW ``x``::

    n_i = beta_i + sum_j gamma[i, j] s(x_j)          y_i = x_i * n_i^a

``gamma[i, j]`` is laid out [output channel i, input channel j]: row i holds
the weights with which output channel i is normalised. This is CompressAI's
layout (its 1x1 convolution weight), though its docstring writes the
transpose; tensorflow-compression stores the transpose (its norm is
``square(x) @ gamma``), so its gamma loads transposed. ``tests/ops/test_gdn.py``
pins the layout down. The variants differ in the pixel statistic s and the
exponent a:

    ==================  =======  ======  ===========================
    variant             s(x)     a       D = n^a, cached
    ==================  =======  ======  ===========================
    gdn                 x^2      -1/2    n^-1/2   (Ballé et al. 2016)
    igdn (inverse)      x^2      +1/2    n^1/2
    gdn_simplified      |x|      -1      1/n      (Johnston et al. 2019)
    igdn_simplified     |x|      +1      n
    ==================  =======  ======  ===========================

Stored parameters. With ``parametrized=(beta_bound, gamma_bound, pedestal)``
the operator's beta and gamma inputs are the stored forms p that the GDN
layer trains (:mod:`gdnflow.ops.parametrize`), and the normalisation uses
the effective values::

    beta  = max(p_beta,  beta_bound)^2  - pedestal
    gamma = max(p_gamma, gamma_bound)^2 - pedestal

computed inside the operator: one autograd node per layer instead of three
(two reparameterisations and the normalisation), and on the GPU one small
launch instead of four (two each way).

Backward
--------
For a loss L with output gradient gy, only n_i depends on beta and gamma, and
x_k reaches the loss directly (through y_k) and through every n_i with
gamma[i, k] != 0. At one pixel::

    dL/dn_i     = gy_i * x_i * a n_i^(a-1)  = a t_i,    t_i := gy_i y_i / n_i
    dL/dx_k     = gy_k n_k^a  +  s'(x_k) sum_i gamma[i, k] dL/dn_i
    dL/dbeta_i  = sum dL/dn_i
    dL/dgamma[i, j] = sum dL/dn_i s(x_j)

where the last two sum over images and pixels, and the sum over i in dL/dx
runs down gamma's *column* k: it is gamma^T applied to the vector dL/dn.
With s' = 2x for the square and sign(x) for |x| (sign(0) = 0, a subgradient):

    gdn              t = gy x n^-3/2 = gy x D^3    gx = gy D - x gamma^T t
                     gbeta = -1/2 sum t            ggamma[i, j] = -1/2 sum t_i x_j^2
    igdn             t = gy x n^-1/2 = gy x / D    gx = gy D + x gamma^T t
                     gbeta = +1/2 sum t            ggamma[i, j] = +1/2 sum t_i x_j^2
    gdn_simplified   t = gy x n^-2   = gy x D^2    gx = gy D - sign(x) gamma^T t
                     gbeta = -sum t                ggamma[i, j] = -sum t_i |x_j|
    igdn_simplified  t = gy x                      gx = gy D + sign(x) gamma^T t
                     gbeta = +sum t                ggamma[i, j] = +sum t_i |x_j|

(the 2 of d(x^2)/dx cancels the 1/2 of a = ±1/2 in gx). Inverting the
normalisation flips every sign because a changes sign. In every variant
n^(a-1) = D^((a-1)/a), i.e. D^3, 1/D, D^2 or 1, so D = n^a cached by the
forward is all the backward needs: the norm is never recomputed. Both backends
compute U = dL/dn (= a t) once and take every gradient from it.

With stored parameters, the chain rule through v = max(p, bound)^2 - pedestal
is applied to dL/dbeta and dL/dgamma as they are written::

    dL/dp = 2 max(p, bound) dL/dv    where p >= bound or dL/dv < 0, else 0

(the gradient of :class:`~gdnflow.ops.parametrize.NonNegativeParametrize`,
which passes below the bound when negative). The input gradient needs the
effective gamma, which the forward keeps.

The GPU path
------------
With P = N*H*W pixels, cut into P / K chunks of K pixels (see below)::

    forward   S = s(x)                          kernel <variant>_statistic
              beta, gamma = max(p, bound)^2     kernel gdn_effective_params
                            - pedestal            (stored parameters only)
              NORM = gamma @ S                  SGEMM [C, C] @ [C, K], per chunk
              D = (NORM + beta)^a, y = x * D    kernel <variant>_forward (D over NORM)
    backward  U = dL/dn,                        kernel <variant>_backward_norm
                B = U's sums per 32 W pixels      (S: the forward's, kept, or here)
              PART_j = U_j @ S_j^T              SGEMM [C, K] @ [K, C], per chunk
              ggamma = sum_j PART_j,            kernel gdn_reduce_param_grads, or
                gbeta = the sum of B              gdn_reduce_param_grads_parametrized
                (then dL/dp, stored parameters)
              G = gamma^T @ U                   SGEMM [C, C]^T @ [C, K], per chunk
              gx = gy D + s'(x) G               kernel <variant>_backward_input

Where C is 64, 128 or 192, H*W % 4 == 0 and the arrays are 16-byte aligned
(:meth:`CudaPlan.fused`, switch ``FUSED``), two kernels of gdnflow's own do
the products over channels with the elementwise work folded in, and the
intermediates NORM, U and G never cross memory::

    forward   beta, gamma^T = ...               kernel gdn_effective_params (stored
                                                  parameters) or gdn_transpose_gamma
              y = x * D, D = (gamma @ s(x)      kernel <variant>_fused_forward
                  + beta)^a; D and S kept         (one block: C channels x 64 pixels)
    backward  gx = gy D + s'(x) gamma^T @ U,    kernel <variant>_fused_backward
                U = dL/dn from (gy, x, D);        (also writes U, and B: U's sums
                                                  per block of 64 pixels)
              PART_j, ggamma, gbeta             as above (SGEMM per chunk, reduction)

They run the product at 0.75-0.85x cuBLAS's rate and still cut the
forward's GPU time by 30% (111 -> 77 us) and that of the three backward
stages they replace by more than a third (131 -> 82 us) at 8x192x64x64 on
an H200 (``benchmarks/results/profile_gdn.md``). Without dL/dx the backward is the
unfused one; D and S are chunked on both paths, so either backward reads
either forward's cache.

The statistic is queued before the parameters' transform so that the GPU
starts on the large kernel while Python still queues the small one, and the
transform's chain rule costs the backward nothing: the reduction that writes
the parameter gradients applies it to each element on its way out.

dL/dbeta is U's sum over the pixels. The backward_norm kernel, W floats per
thread, adds each warp's 32 W values of U and writes the sum to B (1/128 of
U's size at W = 4); the reduction adds B's H*W / (32 W) sums per image and
channel. That needs H*W % (32 W) == 0 (a warp then lies in one image and
channel: :func:`beta_segments`). Elsewhere S1 = [S; 1] replaces S, and the
ones row makes the pixel sum a last column of the same GEMM (C + 1
columns: at C = 192 that column cost ~11 us of the product's ~90 on an
H200, which is why it is avoided where it can be), and the backward_norm
kernel writes S1 (the forward's S is not kept then).

Each "per chunk" SGEMM is one strided-batched cuBLAS call. S, NORM/D, U, S1
and G are stored channel-major in chunks, [P / K][C][K] (S1: [P / K][C + 1][K]),
not NCHW. In NCHW the norm would be a batched GEMM per image (fine), but
ggamma = sum_n U_n S_n^T would be N products with K = H*W each, tied to the
batch size (8 images of 192 channels: 8 x 4 output tiles of 128 x 128 on a
GPU of 132 SMs). With one chunk (K = P, plain CNHW, the first version) it is
one GEMM with K = N*H*W and 4 output tiles, and its speed is up to how
cuBLAS splits that K. Cut into chunks, the split is ours: :func:`choose_chunks`
takes K, a divisor of P, so that chunks x tiles is about
``PARAM_GEMM_CTAS_PER_SM`` per SM (64 chunks of 512 pixels at 8x192x64x64),
and one small kernel sums the [C, C] partial products (with S1: [C, C + 1],
splitting off gbeta on the way). The forward and input GEMMs are the same
products either way, one per chunk. The kernels that produce S, D, U and S1
write them in the chunked layout at no extra traffic (only their index
arithmetic changes; pixels stay contiguous in both layouts, so accesses stay
coalesced), and move 16 bytes per access where H*W % 4 == 0 (K is then kept
a multiple of 4 too).

Module switches, read on every call, keep earlier versions selectable for
an A/B in one process (``benchmarks/bench_gdn.py``, ``benchmarks/profile_gdn.py``):
``PARAM_GEMM_CHUNKS`` ("auto", or a chunk count to aim at; 1 is one GEMM
over all pixels), ``VECTORIZE`` (False: 4-byte accesses), ``BETA_SUMS``
(False: always the ones row, S never kept; the cuBLAS path only) and
``FUSED`` (False: the cuBLAS path everywhere). Each variant and input shape
gets a :class:`CudaPlan`, built once, that holds the kernels, grids and GEMM
shapes and runs the stages above one method each.

Memory per layer
----------------
float32, with M = N*C*H*W elements, P = N*H*W pixels and P / K chunks:

- kept from forward to backward: D (M floats; the forward's GEMM output buffer,
  overwritten in place); S (M floats) when beta or gamma needs a gradient and
  dL/dbeta comes from segment sums (the backward then does not write it
  again, ~6 us at 8x192x64x64); and references to x (M floats, alive until
  the backward unless something else holds it anyway) and gamma (C*C). With
  stored parameters that gamma is the effective one, an array of the
  forward's own (C*C floats), and references to the stored beta and gamma
  are kept too.
  Nothing is kept when no input requires a gradient or under ``no_grad``: D
  is then not even written.
- transient in the forward: S (M) unless kept, freed once the GEMM has read
  it (the fused forward writes S only when it is kept); with stored
  parameters the effective beta (C); on the fused path gamma^T (C*C).
- transient in the backward: U (M; on the fused path only when beta or
  gamma needs a gradient); G (M, not on the fused path), in S1's buffer
  where S1 was written (M + P); B (M / 128 at W = 4, M / 64 fused); the
  partial products (P / K * C * C:
  9.4 MB at 8x192x64x64, against 25 MB for M; C + 1 columns with S1); and
  the gradients themselves.
"""
import functools
import math

import numpy as np

from gdnflow.autograd import Operator, grad_enabled
from gdnflow.backends import cuda
from gdnflow.errors import ShapeError
from gdnflow.ops.parametrize import (NonNegativeParametrize, nonnegative_value,
                                     nonnegative_value_grad)
from gdnflow.registry import register

SOURCE = "gdn.cu"

#: (inverse, simplified) -> (name of the variant, which prefixes its kernels; exponent a)
VARIANTS = {
    (False, False): ("gdn", -0.5),
    (True, False): ("igdn", 0.5),
    (False, True): ("gdn_simplified", -1.0),
    (True, True): ("igdn_simplified", 1.0),
}

#: How the parameter-gradient GEMM's pixel sum is cut: "auto" (see
#: :func:`choose_chunks`), or a chunk count to aim at (1: one GEMM over all
#: pixels, the first version). Read on every call.
PARAM_GEMM_CHUNKS = "auto"
#: 16-byte accesses in the elementwise kernels where H*W % 4 == 0 (False: 4-byte,
#: the first version). Read on every call.
VECTORIZE = True
#: dL/dbeta from segment sums of U written by the backward_norm kernel where
#: :func:`beta_segments` allows (False: always the ones row of S1, the first
#: version). Read on every call.
BETA_SUMS = True
#: "auto" aims at this many CTAs of the parameter-gradient GEMM per SM ...
PARAM_GEMM_CTAS_PER_SM = 2
#: ... counting output tiles of this edge (cuBLAS's large FP32 tiles) ...
GEMM_TILE = 128
#: ... and cuts no chunk shorter than this many pixels (each product's K).
MIN_CHUNK_PIXELS = 256
#: The fused GEMM kernels (``<variant>_fused_forward`` and ``_fused_backward``)
#: where :attr:`CudaPlan.fusable` (False: cuBLAS and the elementwise kernels
#: around it, the previous version). Read on every call.
FUSED = True
#: Channel counts the fused kernels are built for (GDN_CHANNELS in gdn.cu).
FUSED_CHANNELS = (64, 128, 192)
#: Pixels per block of the fused kernels (FUSED_PIXELS in gdn.cu).
FUSED_PIXELS = 64
#: The fused kernels' grid has one row of blocks per image (gridDim.y's limit).
MAX_GRID_Y = 65535
#: Threads per block of the elementwise kernels.
BLOCK = 256
#: Warps per block of gdn_reduce_param_grads (GDN_REDUCE_ROWS in gdn.cu).
REDUCE_ROWS = 8


def divisors(n):
    """The divisors of the positive integer ``n``, ascending."""
    small, large = [], []
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
    return small + large[::-1]


def choose_chunks(pixels, channels, sm_count, granule=1, request="auto"):
    """Into how many chunks of K pixels the parameter-gradient GEMM is cut.

    The product [C, P] @ [P, C + 1] has a long K = P but only
    ceil(C / 128) * ceil((C + 1) / 128) output tiles (4 at C = 192). Cut into
    chunks it is a strided-batched GEMM of chunks x tiles CTAs. The count
    returned divides ``pixels`` (every product has the same K), leaves K a
    multiple of ``granule`` (4 where the 16-byte kernels may run: four
    consecutive pixels never straddle two chunks), and is, among those, the
    nearest by ratio to ``request``: for "auto" the count that gives
    ``PARAM_GEMM_CTAS_PER_SM`` CTAs per SM with K >= ``MIN_CHUNK_PIXELS``;
    for a number, that number (any K). 1 when nothing better qualifies.
    """
    if request == "auto":
        tiles = -(-channels // GEMM_TILE) * -(-(channels + 1) // GEMM_TILE)
        target, shortest = PARAM_GEMM_CTAS_PER_SM * sm_count / tiles, MIN_CHUNK_PIXELS
    else:
        target, shortest = float(request), 1
    if target <= 1 or pixels <= 1:
        return 1
    best, best_distance = 1, math.log(target)
    for chunks in divisors(pixels)[1:]:
        k = pixels // chunks
        if k % granule or k < shortest:
            continue
        distance = abs(math.log(chunks / target))
        if distance < best_distance:
            best, best_distance = chunks, distance
    return best


def beta_segments(hw, width):
    """How many segment sums of U per NCHW row the backward_norm kernel writes
    for dL/dbeta, with ``width`` floats per thread: H*W / (32 width) when that
    divides evenly (each warp's 32 * width values then lie in one row), else
    0 (the ones row of S1 instead)."""
    return hw // (32 * width) if hw % (32 * width) == 0 else 0


@functools.lru_cache(maxsize=256)
def cuda_plan(variant, shape, chunks="auto"):
    """The :class:`CudaPlan` of ``variant`` for inputs of ``shape``, built once."""
    return CudaPlan(variant, shape, chunks)


class CudaPlan:
    """Every launch of one variant at one input shape (N, C, H, W), prepared once.

    Holds the kernels, grids, chunking (``chunks`` chunks of ``chunk`` = K
    pixels, :func:`choose_chunks` given ``chunks_request``) and GEMM shapes;
    each stage of the module docstring's table is one method taking device
    arrays, in the order the operator calls them. ``vec`` selects the
    16-byte kernels; see :meth:`vectorized`. ``benchmarks/profile_gdn.py``
    times the stages one by one.
    """

    #: The elementwise stages: kernel <variant>[_vec4]_<stage> and its argument types.
    KERNELS = {"statistic": "PPiiii", "forward": "PPPPiiiii",
               "backward_norm": "PPPPPPiiii", "backward_input": "PPPPPiiii"}

    def __init__(self, variant, shape, chunks_request="auto"):
        from gdnflow.backends.cuda import blas
        from gdnflow.backends.cuda.kernels import check_index_range, launch_grid
        from gdnflow.backends.cuda.runtime import get_runtime
        batch, channels, height, width = shape
        self.variant, self.shape, self.channels = variant, tuple(shape), channels
        self.hw = height * width
        self.pixels = batch * self.hw
        self.total = channels * self.pixels
        self.can_vectorize = self.hw % 4 == 0
        self.chunks = choose_chunks(self.pixels, channels, get_runtime().sm_count,
                                    4 if self.can_vectorize else 1, chunks_request)
        self.chunk = self.pixels // self.chunks
        check_index_range(self.total + self.pixels, variant)
        check_index_range(self.chunks * channels * (channels + 1), variant)
        self.matmul = blas.matmul
        self.kernels = {}
        for vec, suffix, floats in ((False, "", 1), (True, "_vec4", 4)):
            if vec and not self.can_vectorize:
                continue
            grid = launch_grid(self.total // floats, BLOCK)     # one thread per group of floats
            for stage, arg_types in self.KERNELS.items():
                self.kernels[stage, vec] = (
                    cuda.kernel(SOURCE, f"{variant}{suffix}_{stage}", arg_types), grid)
        self.reduce_kernels = {
            False: cuda.kernel(SOURCE, "gdn_reduce_param_grads", "PPPPiiiii"),
            True: cuda.kernel(SOURCE, "gdn_reduce_param_grads_parametrized", "PPPPPPiiiiiff")}
        # The fused kernels: one module per C; D, S and U stay chunked, so
        # either path's backward reads the other's forward.
        self.fusable = (channels in FUSED_CHANNELS and self.can_vectorize
                        and self.chunk % 4 == 0 and batch <= MAX_GRID_Y)
        if self.fusable:
            defines = (("GDN_CHANNELS", channels),)
            self.fused_kernels = (
                cuda.kernel(SOURCE, f"{variant}_fused_forward", "PPPPPPii", defines),
                cuda.kernel(SOURCE, f"{variant}_fused_backward", "PPPPPPPPii", defines))
            #: Segment sums of U per NCHW row from the fused backward: one per block.
            self.fused_segments = -(-self.hw // FUSED_PIXELS)
            self.fused_grid = (self.fused_segments, batch, 1)
        self.params_kernel = cuda.kernel(SOURCE, "gdn_effective_params", "PPPPPifff")
        self.transpose_kernel = cuda.kernel(SOURCE, "gdn_transpose_gamma", "PPi")
        self.params_grid = launch_grid(channels * (channels + 1), BLOCK)
        self.sizes = (self.total, channels, self.hw, self.chunk)

    def vectorized(self, *arrays):
        """Whether the 16-byte kernels may run on these NCHW arrays: ``VECTORIZE``
        is on, H*W % 4 == 0 and every pointer is 16-byte aligned."""
        if not (VECTORIZE and self.can_vectorize):
            return False
        return not any(a.ptr & 15 for a in arrays)

    def fused(self, *arrays):
        """Whether the fused kernels may run on these arrays (NCHW tensors and
        gamma): ``FUSED`` is on, C is one they are built for, and
        :meth:`vectorized` holds."""
        return FUSED and self.fusable and self.vectorized(*arrays)

    def beta_segments(self, vec):
        """Segment sums of U per NCHW row that the backward_norm kernel of width
        4 (``vec``) or 1 writes for dL/dbeta: :func:`beta_segments`."""
        return beta_segments(self.hw, 4 if vec else 1)

    def empty(self, rows):
        """An uninitialised chunked matrix [chunks, rows, K] (rows = C, or C + 1 for S1)."""
        return cuda.empty((self.chunks, rows, self.chunk), np.float32)

    def _launch(self, stage, vec, *args):
        kernel, grid = self.kernels[stage, vec]
        kernel(grid, (BLOCK, 1, 1), *args)

    # -- forward
    def statistic(self, x, s, vec):
        """S = s(x), chunked."""
        self._launch("statistic", vec, x.ptr, s.ptr, *self.sizes)

    def effective_params(self, beta, gamma, beta_eff, gamma_eff, parametrized, gamma_t=None):
        """beta_eff, gamma_eff = max(p, bound)^2 - pedestal of the stored ``beta`` and
        ``gamma``, with ``parametrized`` = (beta_bound, gamma_bound, pedestal);
        gamma_eff's transpose into ``gamma_t`` unless it is None."""
        self.params_kernel(self.params_grid, (BLOCK, 1, 1), beta.ptr, gamma.ptr, beta_eff.ptr,
                           gamma_eff.ptr, 0 if gamma_t is None else gamma_t.ptr,
                           self.channels, *parametrized)

    def transpose_gamma(self, gamma, gamma_t):
        """gamma_t = gamma^T, the fused forward's operand."""
        self.transpose_kernel(self.params_grid, (BLOCK, 1, 1), gamma.ptr, gamma_t.ptr,
                              self.channels)

    def norm_gemm(self, gamma, s, norm):
        """NORM = gamma @ S, one product per chunk."""
        c, k = self.channels, self.chunk
        self.matmul(gamma.ptr, s.ptr, norm.ptr, c, k, c,
                    batch=self.chunks, stride_b=c * k, stride_c=c * k)

    def forward(self, x, norm_d, beta, y, save_d, vec):
        """y = x * D, D = (NORM + beta)^a written over NORM when ``save_d``."""
        self._launch("forward", vec, x.ptr, norm_d.ptr, beta.ptr, y.ptr, *self.sizes, int(save_d))

    def fused_forward(self, x, gamma_t, beta, y, d, s):
        """y = x * D with NORM = gamma @ s(x) in one kernel, given ``gamma_t`` =
        gamma^T; D into ``d`` and S into ``s`` (chunked) unless they are None."""
        self.fused_kernels[0](self.fused_grid, (BLOCK, 1, 1), x.ptr, gamma_t.ptr, beta.ptr, y.ptr,
                              0 if d is None else d.ptr, 0 if s is None else s.ptr,
                              self.hw, self.chunk)

    # -- backward
    def fused_backward(self, x, gy, d, gamma, u, s, beta_sums, gx):
        """gx = gy D + s'(x) (gamma^T @ U) in one kernel, U = dL/dn from (gy, x, D);
        unless None, U into ``u``, S into ``s`` (chunked) and U's sums over each
        block's pixels into ``beta_sums`` (``fused_segments`` per NCHW row)."""
        self.fused_kernels[1](self.fused_grid, (BLOCK, 1, 1), x.ptr, gy.ptr, d.ptr, gamma.ptr,
                              0 if u is None else u.ptr, 0 if s is None else s.ptr,
                              0 if beta_sums is None else beta_sums.ptr, gx.ptr,
                              self.hw, self.chunk)

    def backward_norm(self, x, gy, d, u, s, beta_sums, vec):
        """U = dL/dn, chunked; U's segment sums into ``beta_sums`` unless it is
        None; S = s(x) into ``s`` unless it is None (S1 = [s(x); 1] where
        ``beta_sums`` is None)."""
        self._launch("backward_norm", vec, x.ptr, gy.ptr, d.ptr, u.ptr,
                     0 if s is None else s.ptr, 0 if beta_sums is None else beta_sums.ptr,
                     *self.sizes)

    def param_gemm(self, u, s, partial, columns):
        """partial[j] = U_j @ S_j^T, [chunks, C, columns]: columns = C + 1 when
        ``s`` is S1 (the last column is then dL/dbeta's pixel sum)."""
        c, k = self.channels, self.chunk
        self.matmul(u.ptr, s.ptr, partial.ptr, c, columns, k, trans_b=True, batch=self.chunks,
                    stride_a=c * k, stride_b=columns * k, stride_c=c * columns)

    def reduce_param_grads(self, partial, beta_sums, ggamma, gbeta, stored=None):
        """ggamma (and gbeta) = the sum of the partial products over the chunks;
        gbeta from ``beta_sums``' segments instead where it is not None.

        With ``stored`` = (beta, gamma, beta_bound, gamma_bound), the stored
        parameters and their bounds, the gradients with respect to the stored
        forms instead (see the module docstring's backward).
        """
        columns = partial.shape[2]
        sums = (0, 0) if beta_sums is None else (beta_sums.ptr, beta_sums.size // (
            self.shape[0] * self.channels))
        args = (self.channels, columns, self.chunks, self.shape[0], sums[1])
        # Blocks of 32 product elements, then (segment sums) one per channel.
        grid = (-(-self.channels * columns // 32) + (self.channels if sums[1] else 0), 1, 1)
        if stored is None:
            self.reduce_kernels[False](grid, (32, REDUCE_ROWS, 1), partial.ptr,
                                       sums[0], ggamma.ptr, gbeta.ptr, *args)
        else:
            beta, gamma, beta_bound, gamma_bound = stored
            self.reduce_kernels[True](grid, (32, REDUCE_ROWS, 1), partial.ptr,
                                      sums[0], ggamma.ptr, gbeta.ptr, beta.ptr, gamma.ptr,
                                      *args, beta_bound, gamma_bound)

    def input_gemm(self, gamma, u, g):
        """G = gamma^T @ U, one product per chunk."""
        c, k = self.channels, self.chunk
        self.matmul(gamma.ptr, u.ptr, g.ptr, c, k, c, trans_a=True,
                    batch=self.chunks, stride_b=c * k, stride_c=c * k)

    def backward_input(self, x, gy, d, g, gx, vec):
        """gx = gy D + s'(x) G."""
        self._launch("backward_input", vec, x.ptr, gy.ptr, d.ptr, g.ptr, gx.ptr, *self.sizes)


@register("gdn")
class GDNOperator(Operator):
    """y = x * n^a with n = beta + gamma s(x) per pixel (see the module docstring).

    Inputs: ``x`` (N, C, H, W), ``beta`` (C,) and ``gamma`` (C, C), laid out
    [output channel, input channel]. Output: the shape of x. ``inverse``
    selects a = +1/2 (inverse GDN) over -1/2; ``simplified`` uses s = |x| and
    a = -1 (or +1 inverse) instead of s = x^2. beta should be positive and
    gamma non-negative; the operator itself does not enforce it, unless
    ``parametrized`` = (beta_bound, gamma_bound, pedestal) is given: beta and
    gamma are then stored forms p, used as max(p, bound)^2 - pedestal
    (:mod:`gdnflow.ops.parametrize`), and their gradients are with respect
    to p.
    """

    def __init__(self, inverse=False, simplified=False, parametrized=None):
        self.inverse = bool(inverse)
        self.simplified = bool(simplified)
        self.variant, self.exponent = VARIANTS[self.inverse, self.simplified]
        if parametrized is not None:
            parametrized = tuple(float(v) for v in parametrized)
            if len(parametrized) != 3:
                raise ValueError(f"{self.label}: parametrized must be (beta_bound, gamma_bound, "
                                 f"pedestal), got {len(parametrized)} values")
        self.parametrized = parametrized

    @property
    def label(self):
        """The variant's name (``gdn``, ``igdn``, ``gdn_simplified``, ``igdn_simplified``)."""
        return self.variant

    def check(self, x, beta, gamma):
        if x.ndim != 4:
            raise ShapeError(f"{self.label}: x must be 4-D (N, C, H, W), got shape {x.shape}")
        c = x.shape[1]
        if beta.shape != (c,):
            raise ShapeError(f"{self.label}: beta must have shape ({c},), one value per channel "
                             f"of x {x.shape}, got {beta.shape}")
        if gamma.shape != (c, c):
            raise ShapeError(f"{self.label}: gamma must have shape ({c}, {c}) [output channel, "
                             f"input channel] for x of shape {x.shape}, got {gamma.shape}")
        # Decided here, where the tensors are seen: the forward skips the
        # cache (and, on the GPU, writing D) when no backward can follow.
        self.keep_for_backward = grad_enabled() and (
            x.requires_grad or beta.requires_grad or gamma.requires_grad)

    def fold_parameters(self, beta, gamma):
        """(operator, effective beta, effective gamma) from stored beta and gamma Tensors.

        The operator computes the same normalisation from the effective
        values; for inference plans, which evaluate the reparameterisation
        of constant weights once (:func:`gdnflow.inference.fold_constants`).
        Only for a ``parametrized`` operator.
        """
        beta_bound, gamma_bound, pedestal = self.parametrized
        return (GDNOperator(self.inverse, self.simplified),
                NonNegativeParametrize(beta_bound, pedestal)(beta),
                NonNegativeParametrize(gamma_bound, pedestal)(gamma))

    # ------------------------------------------------------------- NumPy --
    def statistic(self, x):
        """s(x): x^2, or |x| for the simplified variants (NumPy)."""
        return np.abs(x) if self.simplified else x * x

    def statistic_grad(self, x):
        """s'(x): 2x, or sign(x) for the simplified variants (NumPy)."""
        return np.sign(x) if self.simplified else 2 * x

    def forward_numpy(self, x, beta, gamma):
        stored = None
        if self.parametrized is not None:
            beta_bound, gamma_bound, pedestal = self.parametrized
            stored = (beta, gamma)
            beta = nonnegative_value(beta, beta_bound, pedestal)
            gamma = nonnegative_value(gamma, gamma_bound, pedestal)
        batch, channels, height, width = x.shape
        s = self.statistic(x).reshape(batch, channels, height * width)
        norm = (gamma @ s).reshape(x.shape) + beta[:, None, None]
        d = np.power(norm, x.dtype.type(self.exponent))
        if self.keep_for_backward:
            self.saved = (x, gamma, d, stored)
        return x * d

    def backward(self, grad_output):
        return tuple(None if g is None else self.wrap(g)
                     for g in self.dispatch("backward", grad_output.data))

    def backward_numpy(self, gy):
        x, gamma, d, stored = self.saved
        a = self.exponent
        batch, channels, height, width = x.shape
        # dL/dn = a gy x n^(a-1), with n^(a-1) = D^((a-1)/a) from the cache.
        u = a * gy * x * np.power(d, x.dtype.type((a - 1) / a))
        u3 = u.reshape(batch, channels, height * width)
        need_x, need_beta, need_gamma = self.needs_grad
        gx = gbeta = ggamma = None
        if need_x:
            gx = gy * d + self.statistic_grad(x) * (gamma.T @ u3).reshape(x.shape)
        if need_beta:
            gbeta = u.sum(axis=(0, 2, 3))
        if need_gamma:
            s3 = self.statistic(x).reshape(batch, channels, height * width)
            ggamma = np.tensordot(u3, s3, axes=([0, 2], [0, 2]))
        if stored is not None:      # gradients of the stored forms
            beta_bound, gamma_bound, _ = self.parametrized
            if need_beta:
                gbeta = nonnegative_value_grad(stored[0], gbeta, beta_bound)
            if need_gamma:
                ggamma = nonnegative_value_grad(stored[1], ggamma, gamma_bound)
        return gx, gbeta, ggamma

    # -------------------------------------------------------------- CUDA --
    def forward_cuda(self, x, beta, gamma):
        y = cuda.empty(x.shape, x.dtype)
        keep = self.keep_for_backward
        stored = None if self.parametrized is None else (beta, gamma)
        if x.size == 0:
            if keep:
                self.saved = (x, gamma, None, None, None, stored)
            return y
        plan = cuda_plan(self.variant, x.shape, PARAM_GEMM_CHUNKS)
        if plan.fused(x, y, gamma):
            return self.forward_fused(plan, x, beta, gamma, y, stored)
        vec = plan.vectorized(x, y)
        s = plan.empty(plan.channels)
        plan.statistic(x, s, vec)
        if stored is not None:
            # After the statistic: the GPU runs that while Python queues this.
            beta = cuda.empty(beta.shape, beta.dtype)
            gamma = cuda.empty(gamma.shape, gamma.dtype)
            plan.effective_params(*stored, beta, gamma, self.parametrized)
        norm = plan.empty(plan.channels)
        plan.norm_gemm(gamma, s, norm)
        # S is dL/dgamma's right-hand side too: kept when that product will
        # read it as it is (segment sums for dL/dbeta), else back to the pool
        # (stream order keeps the GEMM's reads first).
        keep_s = (keep and any(self.needs_grad[1:]) and BETA_SUMS
                  and plan.beta_segments(vec) > 0)
        plan.forward(x, norm, beta, y, keep, vec)
        if keep:
            self.saved = (x, gamma, norm, s if keep_s else None, plan, stored)  # norm holds D
        return y

    def forward_fused(self, plan, x, beta, gamma, y, stored):
        """The forward as one fused kernel (after the parameters' transform)."""
        keep = self.keep_for_backward
        gamma_t = cuda.empty(gamma.shape, gamma.dtype)
        if stored is not None:
            beta = cuda.empty(beta.shape, beta.dtype)
            gamma = cuda.empty(gamma.shape, gamma.dtype)
            plan.effective_params(*stored, beta, gamma, self.parametrized, gamma_t)
        else:
            plan.transpose_gamma(gamma, gamma_t)
        d = plan.empty(plan.channels) if keep else None
        # S for dL/dgamma's product, written as the kernel reads x anyway.
        s = plan.empty(plan.channels) if keep and any(self.needs_grad[1:]) else None
        plan.fused_forward(x, gamma_t, beta, y, d, s)
        if keep:
            self.saved = (x, gamma, d, s, plan, stored)
        return y

    def backward_cuda(self, gy):
        x, gamma, d, kept_s, plan, stored = self.saved
        channels = x.shape[1]
        need_x, need_beta, need_gamma = self.needs_grad
        need_params = need_beta or need_gamma
        if x.size == 0:
            from gdnflow.backends import get_backend
            zeros = get_backend("cuda").full
            return (cuda.empty(x.shape, x.dtype) if need_x else None,
                    zeros((channels,), 0.0, x.dtype) if need_beta else None,
                    zeros((channels, channels), 0.0, x.dtype) if need_gamma else None)
        gx = cuda.empty(x.shape, x.dtype) if need_x else None
        if need_x and plan.fused(x, gy, gx, gamma):
            return self.backward_fused(gy, gx)
        vec = plan.vectorized(x, gy, *([gx] if need_x else []))
        u = plan.empty(channels)
        s1 = beta_sums = written = None
        if need_params:
            segments = plan.beta_segments(vec) if BETA_SUMS else 0
            columns = channels if segments else channels + 1
            if segments and kept_s is not None:
                s1 = kept_s         # the forward's S, already in place
            else:
                s1 = written = plan.empty(columns)
            if segments:
                beta_sums = cuda.empty((x.shape[0] * channels * segments,), x.dtype)
        plan.backward_norm(x, gy, d, u, written, beta_sums, vec)
        gbeta, ggamma = (self.param_grads(plan, u, s1, columns, beta_sums) if need_params
                         else (None, None))
        del beta_sums
        if need_x:
            # S1 written here is free once the GEMM above has read it (same
            # stream): G goes there, saving an M-float allocation at the
            # backward's peak. (Not the kept S: a retained graph reads it again.)
            g = written if written is not None else plan.empty(channels)
            plan.input_gemm(gamma, u, g)
            plan.backward_input(x, gy, d, g, gx, vec)
        return (gx, gbeta if need_beta else None, ggamma if need_gamma else None)

    def backward_fused(self, gy, gx):
        """The backward with dL/dx from one fused kernel, which also writes U
        (and S, unless the forward kept it) for the parameter gradients."""
        x, gamma, d, kept_s, plan, stored = self.saved
        _, need_beta, need_gamma = self.needs_grad
        u = s = beta_sums = None
        if need_beta or need_gamma:
            u = plan.empty(plan.channels)
            s = None if kept_s is not None else plan.empty(plan.channels)
            beta_sums = cuda.empty((x.shape[0] * plan.channels * plan.fused_segments,), x.dtype)
        plan.fused_backward(x, gy, d, gamma, u, s, beta_sums, gx)
        if u is None:
            return gx, None, None
        gbeta, ggamma = self.param_grads(plan, u, kept_s if s is None else s, plan.channels,
                                         beta_sums)
        return gx, gbeta if need_beta else None, ggamma if need_gamma else None

    def param_grads(self, plan, u, s1, columns, beta_sums):
        """(dL/dbeta, dL/dgamma) from U and S (or S1, ``columns`` = C + 1) through
        the chunked product and its reduction; with stored parameters, with
        respect to the stored forms."""
        x, stored = self.saved[0], self.saved[5]
        channels = plan.channels
        partial = cuda.empty((plan.chunks, channels, columns), x.dtype)
        plan.param_gemm(u, s1, partial, columns)
        ggamma = cuda.empty((channels, channels), x.dtype)
        gbeta = cuda.empty((channels,), x.dtype)
        plan.reduce_param_grads(partial, beta_sums, ggamma, gbeta,
                                None if stored is None else stored + self.parametrized[:2])
        return gbeta, ggamma
