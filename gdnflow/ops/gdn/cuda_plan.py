"""The GDN operator's CUDA execution plan: every launch of one variant at one
input shape, prepared once (:class:`CudaPlan`, built by :func:`cuda_plan`),
and how the pixels are cut into chunks (:func:`choose_chunks`,
:func:`beta_segments`).

CUDA kernels: ``cuda_src/gdn.cu``; the products over channels are cuBLAS
SGEMMs through :mod:`gdnflow.backends.cuda.blas`, or two fused kernels of
gdnflow's own. The formulas (s, a, D = n^a, U = dL/dn) are those of
:mod:`gdnflow.ops.gdn.operator`; ``docs/gdn.md`` has the design and the
measurements behind it.

Stages
------
With P = N*H*W pixels cut into P / K chunks of K pixels, the cuBLAS path::

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

and the fused path, where :meth:`CudaPlan.fused` holds::

    forward   beta, gamma^T = ...               kernel gdn_effective_params (stored
                                                  parameters) or gdn_transpose_gamma
              y = x * D, D = (gamma @ s(x)      kernel <variant>_fused_forward
                  + beta)^a; D and S kept         (one block: C channels x 64 pixels)
    backward  gx = gy D + s'(x) gamma^T @ U,    kernel <variant>_fused_backward
                U = dL/dn from (gy, x, D);        (also writes U, and B: U's sums
                                                  per block of 64 pixels)
              PART_j, ggamma, gbeta             as above (SGEMM per chunk, reduction)

Each stage is one method of :class:`CudaPlan`, taking device arrays.

Which path runs
---------------
- Fused: ``settings.gdn_fused`` is on, C is in :data:`FUSED_CHANNELS`,
  H*W % 4 == 0, K % 4 == 0, N <= 65535 (gridDim.y: one row of blocks per
  image) and every array is 16-byte aligned. The backward is fused only when dL/dx is asked for.
- Otherwise cuBLAS, with the 16-byte elementwise kernels (``_vec4``) where
  ``settings.gdn_vectorize`` is on, H*W % 4 == 0 and the arrays are 16-byte
  aligned, else the 4-byte ones.
- dL/dbeta comes from B, the segment sums of U, where :func:`beta_segments`
  allows (and ``settings.gdn_beta_sums`` is on; the fused backward always
  writes them); elsewhere from the ones row of S1 = [S; 1], the last column
  of the same product (C + 1 columns).

Layout
------
S, NORM/D, U, S1 and G are stored channel-major in chunks, [P / K][C][K]
(S1: [P / K][C + 1][K]), not NCHW; D and S are chunked on both paths, so
either backward reads either forward's cache. The number of chunks
(:func:`choose_chunks`, ``settings.gdn_param_gemm_chunks``) divides P, and K
is a multiple of 4 where the 16-byte kernels may run.
"""
import functools
import math

import numpy as np

from gdnflow.backends import cuda
from gdnflow.backends.cuda.limits import MAX_GRID_YZ
from gdnflow.config import settings

SOURCE = "gdn.cu"

#: "auto" aims at this many CTAs of the parameter-gradient GEMM per SM ...
PARAM_GEMM_CTAS_PER_SM = 2
#: ... counting output tiles of this edge (cuBLAS's large FP32 tiles) ...
GEMM_TILE = 128
#: ... and cuts no chunk shorter than this many pixels (each product's K).
MIN_CHUNK_PIXELS = 256
#: Channel counts the fused kernels are built for (GDN_CHANNELS in gdn.cu).
FUSED_CHANNELS = (64, 128, 192)
cuda.declare_variants(SOURCE, (), *((("GDN_CHANNELS", c),) for c in FUSED_CHANNELS))
#: Pixels per block of the fused kernels (FUSED_PIXELS in gdn.cu).
FUSED_PIXELS = 64
#: Pixels per tile of the 16-bit kernels (HALF_PIXELS in gdn.cu) ...
HALF_PIXELS = 64
#: ... and their resident blocks per SM (each walks over tiles; __launch_bounds__ in gdn.cu).
HALF_BLOCKS_PER_SM = 2
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
    :data:`PARAM_GEMM_CTAS_PER_SM` CTAs per SM with K >= :data:`MIN_CHUNK_PIXELS`;
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


def half_shared_bytes(channels):
    """Dynamic shared memory of the 16-bit kernels at C = ``channels`` (gdn.cu's
    HalfShared): bfloat16 gamma and operand tile, padded by 8 values per row,
    and each of the 8 warps' 16 x 20 float32 stage."""
    return 2 * channels * (channels + 8) + 2 * channels * (HALF_PIXELS + 8) + 8 * 16 * 20 * 4


def beta_segments(hw, width):
    """How many segment sums of U per NCHW row the backward_norm kernel writes
    for dL/dbeta, with ``width`` floats per thread: H*W / (32 width) when that
    divides evenly (each warp's 32 * width values then lie in one row), else
    0 (the ones row of S1 instead)."""
    return hw // (32 * width) if hw % (32 * width) == 0 else 0


@functools.lru_cache(maxsize=256)
def cuda_plan(variant, shape, chunks="auto"):
    """The :class:`CudaPlan` of ``variant`` for inputs of ``shape``, built once
    (cached here, per variant, shape and ``chunks`` request)."""
    return CudaPlan(variant, shape, chunks)


class CudaPlan:
    """Every launch of one variant at one input shape (N, C, H, W), prepared once.

    Holds the kernels, grids, chunking (``chunks`` chunks of ``chunk`` = K
    pixels, :func:`choose_chunks` given ``chunks_request``) and GEMM shapes;
    each stage of the module docstring's tables is one method taking device
    arrays, in the order the operator calls them. ``vec`` selects the
    16-byte kernels; see :meth:`vectorized`. ``benchmarks/profile_gdn.py``
    times the stages one by one.
    """

    #: The elementwise stages: kernel <variant>[_vec4]_<stage> and its argument types.
    KERNELS = {"statistic": "PPiiii", "forward": "PPPPiiiii",
               "backward_norm": "PPPPPPiiii", "backward_input": "PPPPPiiii"}

    def __init__(self, variant, shape, chunks_request="auto"):
        from gdnflow.backends.cuda import blas  # local import: PyCUDA on first use
        batch, channels, height, width = shape
        self.variant, self.shape, self.channels = variant, tuple(shape), channels
        self.hw = height * width
        self.pixels = batch * self.hw
        self.total = channels * self.pixels
        self.can_vectorize = self.hw % 4 == 0
        # K a multiple of 8 where H*W allows: the 16-bit kernels move 8 values at once.
        granule = 8 if self.hw % 8 == 0 else 4 if self.can_vectorize else 1
        self.chunks = choose_chunks(self.pixels, channels, cuda.sm_count(), granule,
                                    chunks_request)
        self.chunk = self.pixels // self.chunks
        cuda.check_index_range(self.total + self.pixels, variant)
        cuda.check_index_range(self.chunks * channels * (channels + 1), variant)
        self.matmul = blas.matmul
        self.kernels = {}
        for vec, suffix, floats in ((False, "", 1), (True, "_vec4", 4)):
            if vec and not self.can_vectorize:
                continue
            # One thread per group of floats.
            grid = cuda.launch_grid(self.total // floats, BLOCK)
            for stage, arg_types in self.KERNELS.items():
                self.kernels[stage, vec] = (
                    cuda.kernel(SOURCE, f"{variant}{suffix}_{stage}", arg_types), grid)
        self.reduce_kernels = {
            False: cuda.kernel(SOURCE, "gdn_reduce_param_grads", "PPPPiiiii"),
            True: cuda.kernel(SOURCE, "gdn_reduce_param_grads_parametrized", "PPPPPPiiiiiff")}
        # The fused kernels: one module per C; D, S and U stay chunked, so
        # either path's backward reads the other's forward.
        self.fusable = (channels in FUSED_CHANNELS and self.can_vectorize
                        and self.chunk % 4 == 0 and batch <= MAX_GRID_YZ)
        if self.fusable:
            defines = (("GDN_CHANNELS", channels),)
            self.fused_kernels = (
                cuda.kernel(SOURCE, f"{variant}_fused_forward", "PPPPPPii", defines),
                cuda.kernel(SOURCE, f"{variant}_fused_backward", "PPPPPPPPii", defines))
            #: Segment sums of U per NCHW row from the fused backward: one per block.
            self.fused_segments = -(-self.hw // FUSED_PIXELS)
            self.fused_grid = (self.fused_segments, batch, 1)
        # The 16-bit kernels (built on first use, one module per storage dtype).
        # bfloat16 WMMA needs sm_80; gamma in shared memory needs its opt-in (99 KB on
        # sm_86/89 is less than C = 192's 112 KB).
        self.half_shared_bytes = half_shared_bytes(channels)
        self.half_fusable = (channels in FUSED_CHANNELS and self.hw % 8 == 0
                             and self.chunk % 8 == 0 and cuda.compute_capability() >= (8, 0)
                             and cuda.max_shared_bytes() >= self.half_shared_bytes)
        #: Segment sums of U per NCHW row from the 16-bit backward: one per tile.
        self.half_segments = -(-self.hw // HALF_PIXELS)
        self.half_tiles = batch * self.half_segments
        self.half_grid = (min(self.half_tiles, HALF_BLOCKS_PER_SM * cuda.sm_count()), 1, 1)
        self._half_kernels = {}
        self.params_kernel = cuda.kernel(SOURCE, "gdn_effective_params", "PPPPPifff")
        self.transpose_kernel = cuda.kernel(SOURCE, "gdn_transpose_gamma", "PPi")
        self.params_grid = cuda.launch_grid(channels * (channels + 1), BLOCK)
        self.sizes = (self.total, channels, self.hw, self.chunk)

    def vectorized(self, *arrays):
        """Whether the 16-byte kernels may run on these NCHW arrays:
        ``settings.gdn_vectorize`` is on, H*W % 4 == 0 and every pointer is
        16-byte aligned."""
        if not (settings.gdn_vectorize and self.can_vectorize):
            return False
        return not any(a.ptr & 15 for a in arrays)

    def fused(self, *arrays):
        """Whether the fused kernels may run on these arrays (NCHW tensors and
        gamma): ``settings.gdn_fused`` is on, C is one they are built for
        (:attr:`fusable`), and :meth:`vectorized` holds."""
        return settings.gdn_fused and self.fusable and self.vectorized(*arrays)

    def half_fused(self, *arrays):
        """Whether the 16-bit kernels may run on these arrays: ``settings.gdn_fused``
        is on, C is one they are built for, H*W and K are multiples of 8 and
        every array is 16-byte aligned."""
        return (settings.gdn_fused and self.half_fusable
                and not any(a.ptr & 15 for a in arrays))

    def half_kernels(self, dtype):
        """(forward, backward, parameters) kernels of the module built for ``dtype`` storage."""
        kernels = self._half_kernels.get(dtype)
        if kernels is None:
            defines = (("GDN_CHANNELS", self.channels),) + cuda.storage_defines(dtype)
            kernels = (cuda.kernel(SOURCE, f"{self.variant}_half_forward", "PPPPPiii", defines),
                       cuda.kernel(SOURCE, f"{self.variant}_half_backward", "PPPPPPPPiii",
                                   defines),
                       cuda.kernel(SOURCE, "gdn_half_params", "PPPPiifff", defines))
            for kernel in kernels[:2]:
                kernel.allow_shared_bytes(self.half_shared_bytes)
            self._half_kernels[dtype] = kernels
        return kernels

    def half_params(self, beta, gamma, beta_eff, gamma_half, parametrized, dtype):
        """gamma_half = gamma rounded to bfloat16, the 16-bit kernels' operand; with
        ``parametrized`` = (beta_bound, gamma_bound, pedestal), ``beta`` and
        ``gamma`` are stored forms: gamma_half gets the effective gamma and
        ``beta_eff`` the effective beta (None: not written)."""
        bounds = (1,) + tuple(parametrized) if parametrized is not None else (0, 0.0, 0.0, 0.0)
        self.half_kernels(dtype)[2](self.params_grid, (BLOCK, 1, 1), beta.ptr, gamma.ptr,
                                    0 if beta_eff is None else beta_eff.ptr, gamma_half.ptr,
                                    self.channels, *bounds)

    def half_forward(self, x, gamma_half, beta, y, d):
        """y = x * D for 16-bit x and y, NORM = gamma @ s(x) on the tensor cores;
        D (x's dtype, chunked) into ``d`` unless it is None."""
        self.half_kernels(x.dtype)[0](
            self.half_grid, (BLOCK, 1, 1), x.ptr, gamma_half.ptr, beta.ptr, y.ptr,
            0 if d is None else d.ptr, self.shape[0], self.hw, self.chunk,
            shared_bytes=self.half_shared_bytes)

    def half_backward(self, x, gy, d, gamma_half, u, s, beta_sums, gx):
        """gx = gy D + s'(x) (gamma^T @ U) for 16-bit x, gy, D and gx, U = dL/dn;
        unless None: U and S = s(x) in bfloat16 into ``u`` and ``s`` (chunked),
        U's float32 sums over each 64-pixel tile into ``beta_sums``
        (:attr:`half_segments` per NCHW row); gx None computes only those."""
        self.half_kernels(x.dtype)[1](
            self.half_grid, (BLOCK, 1, 1), x.ptr, gy.ptr, d.ptr, gamma_half.ptr,
            0 if u is None else u.ptr, 0 if s is None else s.ptr,
            0 if beta_sums is None else beta_sums.ptr, 0 if gx is None else gx.ptr,
            self.shape[0], self.hw, self.chunk, shared_bytes=self.half_shared_bytes)

    def beta_segments(self, vec):
        """Segment sums of U per NCHW row that the backward_norm kernel of width
        4 (``vec``) or 1 writes for dL/dbeta: :func:`beta_segments`."""
        return beta_segments(self.hw, 4 if vec else 1)

    def empty(self, rows, dtype=np.float32):
        """An uninitialised chunked matrix [chunks, rows, K] (rows = C, or C + 1 for S1)."""
        return cuda.empty((self.chunks, rows, self.chunk), dtype)

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
        """partial[j] = U_j @ S_j^T, [chunks, C, columns] in float32: columns = C + 1
        when ``s`` is S1 (the last column is then dL/dbeta's pixel sum). U and S
        are float32, or bfloat16 (the 16-bit kernels'; float32 sums)."""
        c, k = self.channels, self.chunk
        self.matmul(u.ptr, s.ptr, partial.ptr, c, columns, k, trans_b=True, batch=self.chunks,
                    stride_a=c * k, stride_b=columns * k, stride_c=c * columns, dtype=u.dtype,
                    out_dtype=np.float32)

    def reduce_param_grads(self, partial, beta_sums, ggamma, gbeta, stored=None):
        """ggamma (and gbeta) = the sum of the partial products over the chunks;
        gbeta from ``beta_sums``' segments instead where it is not None.

        With ``stored`` = (beta, gamma, beta_bound, gamma_bound), the stored
        parameters and their bounds, the gradients with respect to the stored
        forms instead (see :mod:`gdnflow.ops.gdn.operator`'s backward).
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

