"""``sparse_conv2d``: direct sparse convolution with a CSR filter (:mod:`gdnflow.sparse.csr`).

Shapes and formula, for x [N, C_in, H, W] and a :class:`~gdnflow.sparse.csr.CSRWeight`
of shape [C_out, C_in, kh, kw] (dilation (dh, dw) part of the CSR), groups 1::

    y[n, o, p, q] = b[o] + sum_{k in row o} values[k]
                    * x[n, c_k, p*sh - top + i_k*dh, q*sw - left + j_k*dw]

zero outside the input; OH, OW as for :func:`gdnflow.ops.conv2d`. In CSR terms,
with xp the input padded to Hp x Wp, ``y[n, o].flat[p*OW + q] = sum_k values[k]
* xp[n].flat[offsets[k] + p*sh*Wp + q*sw]``.

Inputs: x, values [nnz] and optionally bias [C_out], all differentiable.
The pattern (which taps are non-zero) is fixed by the CSRWeight and is not.

NumPy (the reference, vectorised over the entries of a block of rows):
  forward         gather xp at offsets + pixel bases, scale, reduce per row;
  backward-data   the transpose: scatter-add the same products (bincount);
  backward-values gather and contract with gy over images and pixels.

CUDA (``cuda_src/sparse_conv.cu``): one tiled kernel computes the forward
(input planes staged in shared memory CC at a time, borders zero-filled while
staging, so no padded copy of x is made: the staging pass is needed anyway,
to share each input tile among the block's output channels, and bounds
checks there cost nothing in the inner loop, which reads the tile at the
CSR offsets retargeted to the tile's own padded size). The backward-data pass is the same
kernel run on gy with the transposed, flipped filter, once per stride phase:
the gx pixels with h = a (mod sh), w = b (mod sw) receive exactly the taps
with (a + top - i*dh) divisible by sh (and the same along w), and for them
the transpose is again a gather (a stride-1 correlation of gy), so every gx
element is written once, with no atomics. The transposed CSRs are built
once per (filter, geometry) on the host; each backward gathers the values
into their order with one launch. The values' gradient is a reduction per
entry: the forward's tiling, each warp's partial dot product summed with
shuffles and added with one atomic per entry and tile.

Why gather-per-phase rather than a scatter with atomics for backward-data:
the gather writes each gx element once (no zeroing pass, no atomic traffic,
deterministic), and reuses the forward kernel and its tuning; the cost is
the host-side transposition, paid once per (filter, geometry).
"""
import dataclasses
import functools
import math

import numpy as np

from gdnflow.autograd import Operator, grad_enabled
from gdnflow.backends import cuda
from gdnflow.errors import ShapeError
from gdnflow.ops.conv import conv_geometry, conv_parameters
from gdnflow.registry import register
from gdnflow.sparse.csr import CSRWeight

SOURCE = "sparse_conv.cu"
FLOAT = 4
WARPS = 8                       # sparse_conv.cu's WARPS: 256 threads per block
SHARED_BUDGET = 24 * 1024       # bytes of staged input per block: 4+ blocks fit on an SM
#: Elements of the gathered [N, entries, pixels] block the NumPy code handles at once.
NUMPY_BLOCK = 1 << 21


# ------------------------------------------------------------- geometry --
def sparse_geometry(op, x_shape, weight, stride, padding):
    """The :class:`~gdnflow.ops.conv.ConvGeometry` of x convolved with the CSR ``weight``."""
    if len(x_shape) != 4:
        raise ShapeError(f"{op}: expected x [N, C_in, H, W], got shape {tuple(x_shape)}")
    if x_shape[1] != weight.shape[1]:
        raise ShapeError(f"{op}: x has {x_shape[1]} channels, the filter expects "
                         f"{weight.shape[1]} (filter shape {weight.shape})")
    return conv_geometry(op, tuple(x_shape), weight.shape, stride, padding, weight.dilation, 1)


def padded_size(g):
    """(Hp, Wp): the input's size with its padding."""
    top, bottom, left, right = g.padding
    return g.h + top + bottom, g.w + left + right


# ---------------------------------------------------------------- NumPy --
def _row_blocks(row_ptr, cost_per_entry):
    """(first row, end row) blocks whose entries cost at most NUMPY_BLOCK (one row at least)."""
    budget = max(1, NUMPY_BLOCK // max(cost_per_entry, 1))
    rows, r0 = len(row_ptr) - 1, 0
    while r0 < rows:
        r1 = int(np.searchsorted(row_ptr, row_ptr[r0] + budget, side="right")) - 1
        r1 = min(max(r1, r0 + 1), rows)
        yield r0, r1
        r0 = r1


def _numpy_layout(g, csr, x=None):
    """(csr retargeted to the padded size, xp flattened per image or None, pixel bases [P])."""
    top, bottom, left, right = g.padding
    hp, wp = padded_size(g)
    csr = csr.retarget((hp, wp))
    flat = None
    if x is not None:
        flat = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right))).reshape(g.n, -1)
    base = (np.arange(g.oh)[:, None] * (g.stride[0] * wp)
            + np.arange(g.ow)[None, :] * g.stride[1]).ravel()
    return csr, flat, base


def forward_numpy(g, csr, x, values, bias=None):
    """y [N, C_out, OH, OW]: per block of rows, gather the taps, scale, reduce per row."""
    csr, flat, base = _numpy_layout(g, csr, x)
    pixels = base.size
    y = np.zeros((g.n, g.c_out, pixels), dtype=np.result_type(x, values))
    row_ptr = csr.row_ptr
    for r0, r1 in _row_blocks(row_ptr, g.n * pixels):
        k0, k1 = row_ptr[r0], row_ptr[r1]
        if k0 == k1:
            continue
        taps = flat[:, csr.offsets[k0:k1, None] + base]          # [N, entries, P]
        taps *= values[k0:k1, None]
        starts = row_ptr[r0:r1]
        filled = starts < row_ptr[r0 + 1:r1 + 1]                 # reduceat needs non-empty rows
        y[:, r0:r1][:, filled] = np.add.reduceat(taps, starts[filled] - k0, axis=1)
    if bias is not None:
        y += bias.reshape(1, -1, 1)
    return y.reshape(g.y_shape)


def backward_data_numpy(g, csr, gy, values):
    """gx [N, C_in, H, W]: every product of the forward scattered back (the adjoint)."""
    csr, _, base = _numpy_layout(g, csr)
    hp, wp = padded_size(g)
    plane = g.c_in * hp * wp
    pixels = base.size
    gy = gy.reshape(g.n, g.c_out, pixels)
    gx = np.zeros(g.n * plane, dtype=np.float64)
    images = (np.arange(g.n) * plane)[:, None, None]
    for r0, r1 in _row_blocks(csr.row_ptr, g.n * pixels):
        k0, k1 = csr.row_ptr[r0], csr.row_ptr[r1]
        if k0 == k1:
            continue
        where = images + (csr.offsets[k0:k1, None] + base)[None]    # [N, entries, P]
        products = gy[:, csr.rows[k0:k1], :] * values[k0:k1, None]
        gx += np.bincount(where.ravel(), weights=products.ravel(), minlength=gx.size)
    top, _, left, _ = g.padding
    gx = gx.reshape(g.n, g.c_in, hp, wp)[:, :, top:top + g.h, left:left + g.w]
    return np.ascontiguousarray(gx, dtype=np.result_type(gy, values))


def backward_values_numpy(g, csr, x, gy):
    """gvalues [nnz]: gvalues[k] = sum_{n, p, q} gy[n, o_k, p, q] * (the input tap k reads)."""
    csr, flat, base = _numpy_layout(g, csr, x)
    pixels = base.size
    gy = gy.reshape(g.n, g.c_out, pixels)
    gvalues = np.zeros(csr.nnz, dtype=np.result_type(x, gy))
    for r0, r1 in _row_blocks(csr.row_ptr, g.n * pixels):
        k0, k1 = csr.row_ptr[r0], csr.row_ptr[r1]
        if k0 == k1:
            continue
        taps = flat[:, csr.offsets[k0:k1, None] + base]
        gvalues[k0:k1] = np.einsum("nkp,nkp->k", taps, gy[:, csr.rows[k0:k1], :])
    return gvalues


# ----------------------------------------------------------- CUDA tiling --
@dataclasses.dataclass(frozen=True)
class Tiling:
    """The compile-time shape of one sparse_conv.cu variant (see the .cu's header).

    ``tw`` tile width (lanes across), ``rows`` outputs per lane, ``cpw``
    channels per warp, ``cc`` channels per staged chunk, ``sh, sw`` input step
    per output, ``span_h, span_w`` input rows/columns one output reads,
    ``pitch`` the staged row pitch.
    """

    tw: int
    rows: int
    cpw: int
    cc: int
    sh: int
    sw: int
    span_h: int
    span_w: int
    pitch: int

    @property
    def th(self):
        """Tile height in outputs."""
        return self.rows * (32 // self.tw)

    @property
    def in_h(self):
        return (self.th - 1) * self.sh + self.span_h

    @property
    def in_w(self):
        return (self.tw - 1) * self.sw + self.span_w

    @property
    def defines(self):
        return (("TW", self.tw), ("ROWS", self.rows), ("CPW", self.cpw), ("CC", self.cc),
                ("SH", self.sh), ("SW", self.sw), ("SPAN_H", self.span_h),
                ("SPAN_W", self.span_w), ("PITCH", self.pitch))

    def channel_groups(self, channels):
        return -(-channels // (WARPS * self.cpw))

    def blocks(self, n, channels, u, v):
        return n * self.channel_groups(channels) * -(-u // self.th) * -(-v // self.tw)


def _bank_conflicts(tw, rows, sh, sw, pitch):
    """Most lanes of a warp hitting one bank (distinct words) when all read row r of their tile."""
    lanes = np.arange(32)
    words = (lanes // tw) * rows * sh * pitch + (lanes % tw) * sw
    banks = {}
    for word in set(words.tolist()):
        banks[word % 32] = banks.get(word % 32, 0) + 1
    return max(banks.values())


@functools.lru_cache(maxsize=None)
def _pitch(tw, rows, sh, sw, in_w):
    """The smallest row pitch >= in_w with the fewest bank conflicts."""
    return min(range(in_w, in_w + 32),
               key=lambda p: (_bank_conflicts(tw, rows, sh, sw, p), p))


@functools.lru_cache(maxsize=4096)
def choose_tiling(n, channels_out, channels_in, u, v, sh, sw, span_h, span_w, sm_count,
                  per_sm=4):
    """The variant for an output of n x channels_out x u x v: wide tiles, and the most
    outputs per lane (rows x channels) that still give ``per_sm`` blocks per SM."""
    tw = 32 if v > 16 else 16 if v > 8 else 8
    ly = 32 // tw
    max_rows = max(1, -(-u // ly))
    # No more channels per warp than leave every warp of a block some (a
    # 7-channel output gets one per warp, not four in two warps).
    candidates = [(rows, cpw) for rows in (8, 4, 2, 1) for cpw in (4, 2, 1)
                  if (rows <= max_rows or rows == 1)
                  and (cpw == 1 or channels_out > WARPS * cpw // 2)]
    # Prefer more work per lane (register reuse of the entry's value), then
    # more channels per block (input staged once for more of them).
    target = per_sm * sm_count
    choice = None
    for rows, cpw in sorted(candidates, key=lambda rc: (-rc[0] * rc[1], -rc[0])):
        blocks = n * -(-channels_out // (WARPS * cpw)) * -(-u // (rows * ly)) * -(-v // tw)
        if choice is None or blocks > choice[0]:
            choice = (blocks, rows, cpw)
        if blocks >= target:
            choice = (blocks, rows, cpw)
            break
    _, rows, cpw = choice
    in_h = (rows * ly - 1) * sh + span_h
    in_w = (tw - 1) * sw + span_w
    pitch = _pitch(tw, rows, sh, sw, in_w)
    cc = 16
    while cc > 1 and (cc * in_h * pitch * FLOAT > SHARED_BUDGET or cc >= 2 * channels_in):
        cc //= 2
    if cc * in_h * pitch * FLOAT > 48 * 1024:
        raise ShapeError(f"sparse_conv2d: a {span_h}x{span_w} input window per output is too "
                         "large for the CUDA kernel's shared-memory tile")
    return Tiling(tw, rows, cpw, cc, sh, sw, span_h, span_w, pitch)


#: Blocks per SM the tiling aims for (see :func:`choose_tiling`); fewer means
#: more outputs per lane. A knob for benchmarks; plans are cached per value.
blocks_per_sm = 4


class TilePlan:
    """A filter laid out for one tiling, on the device, plus the launch's fixed arguments.

    Entries (row r, staged channel s, shift di, dj), sorted by (r, s, di, dj),
    become offsets ``(s mod cc)*in_h*pitch + di*pitch + dj`` and the table
    ``chunk_ptr[r*(n_chunks+1) + ch]`` of where row r's entries of channel
    chunk ch begin.
    """

    def __init__(self, tiling, rows, channels_out, channels_in, staged, di, dj, geometry):
        t = self.tiling = tiling
        self.n_chunks = max(1, -(-channels_in // t.cc))
        offsets = (staged % t.cc) * (t.in_h * t.pitch) + di * t.pitch + dj
        key = rows.astype(np.int64) * self.n_chunks + staged // t.cc
        targets = (np.arange(channels_out)[:, None] * self.n_chunks
                   + np.arange(self.n_chunks + 1)[None, :]).ravel()
        #: Host copies (the CPU tests replay the kernel on them); device copies on first use.
        self.offsets_host = offsets.astype(np.int32)
        self.chunk_ptr_host = np.searchsorted(key, targets, side="left").astype(np.int32)
        self._device = None
        self._packed = None
        self._launch = None
        #: (C_in, IH, IW, C_out, OH, OW, U, V, row0, col0, out_row0, out_col0, out_sh, out_sw)
        self.geometry = geometry
        c_out, u, v = geometry[3], geometry[6], geometry[7]
        self.groups = t.channel_groups(c_out)
        self.tiles_u, self.tiles_v = -(-u // t.th), -(-v // t.tw)

    def blocks(self, n):
        return n * self.groups * self.tiles_u * self.tiles_v

    @property
    def device_arrays(self):
        """(offsets, chunk_ptr) on the GPU, uploaded once."""
        if self._device is None:
            from gdnflow.backends.cuda.runtime import get_runtime
            runtime = get_runtime()
            # One int32 element at least: an empty filter still gets a valid pointer.
            self._device = (runtime.from_numpy(np.append(self.offsets_host, 0).astype(np.int32)),
                            runtime.from_numpy(self.chunk_ptr_host))
        return self._device

    def entries(self, values):
        """The kernel's (value, offset) pairs for ``values`` (a CudaArray in this plan's order).

        Packed by one launch, and kept while the same array holds the same
        weights (:func:`~gdnflow.nn.module.weights_version` unchanged), so a
        layer's constant values are packed once.
        """
        from gdnflow.nn.module import weights_version
        version = weights_version()
        cached = self._packed
        if cached is not None and cached[0] is values and cached[1] == version:
            return cached[2]
        nnz = self.offsets_host.size
        entries = cuda.empty((2 * max(nnz, 1),))
        if nnz:
            cuda.kernel(SOURCE, "pack_entries", "PPPi").launch(
                nnz, values.ptr, self.device_arrays[0].ptr, entries.ptr, nnz)
        self._packed = (values, version, entries)
        return entries

    def forward(self, n, in_ptr, entries_ptr, bias_ptr, out_ptr):
        """out <- the tiled sparse convolution of the input (see sparse_conv.cu)."""
        if self.blocks(n) == 0:
            return
        if self._launch is None:        # the kernel and its fixed arguments, found once
            self._launch = (cuda.kernel(SOURCE, "sparse_conv_forward", "PPPPP" + "i" * 18,
                                        self.tiling.defines),
                            self.geometry + (self.groups, self.tiles_u, self.tiles_v,
                                             self.n_chunks))
        kernel, fixed = self._launch
        kernel((self.blocks(n), 1, 1), (WARPS * 32, 1, 1), in_ptr, entries_ptr,
               self.device_arrays[1].ptr, bias_ptr, out_ptr, *fixed)

    def values_grad(self, n, in_ptr, gout_ptr, gvalues_ptr):
        if self.blocks(n) == 0:
            return
        c_in, ih, iw, c_out, oh, ow, _, _, row0, col0 = self.geometry[:10]
        kernel = cuda.kernel(SOURCE, "sparse_conv_values_grad", "PPPPP" + "i" * 12,
                             self.tiling.defines)
        offsets, chunk_ptr = self.device_arrays
        kernel((self.blocks(n), 1, 1), (WARPS * 32, 1, 1), in_ptr, gout_ptr, offsets.ptr,
               chunk_ptr.ptr, gvalues_ptr, c_in, ih, iw, c_out, oh, ow, row0, col0,
               self.groups, self.tiles_u, self.tiles_v, self.n_chunks)


def _sm_count():
    from gdnflow.backends.cuda.runtime import get_runtime
    return get_runtime().sm_count


def forward_plan(g, csr, sm_count=None):
    """The forward's :class:`TilePlan` (cached in the CSR per geometry and SM count)."""
    sm_count = sm_count or _sm_count()
    key = ("cuda_forward", g, sm_count, blocks_per_sm)
    plan = csr.cache.get(key)
    if plan is None:
        (sh, sw), (dh, dw) = g.stride, g.dilation
        tiling = choose_tiling(g.n, g.c_out, g.c_in, g.oh, g.ow, sh, sw,
                               (g.kh - 1) * dh + 1, (g.kw - 1) * dw + 1, sm_count, blocks_per_sm)
        top, _, left, _ = g.padding
        plan = TilePlan(tiling, csr.rows, g.c_out, g.c_in, csr.channel, csr.tap_row * dh,
                        csr.tap_col * dw,
                        (g.c_in, g.h, g.w, g.c_out, g.oh, g.ow, g.oh, g.ow, -top, -left,
                         0, 0, 1, 1))
        csr.cache[key] = plan
    return plan


def _phase_taps(a, pad, k, d, s):
    """For gx positions = a (mod s): {tap: shift e} with the gy row read at u + e."""
    return {i: (a + pad - i * d) // s for i in range(k) if (a + pad - i * d) % s == 0}


def backward_plans(g, csr, sm_count=None):
    """([(plan, first entry)] one per stride phase, gather index [total]).

    The phases' entries are concatenated; entry t of the whole takes the
    forward's value ``index[t]``.

    Phase (a, b) computes gx[n, c, a + sh*u, b + sw*v] = sum over the taps
    (i, j) whose gy row (a + top - i*dh)/sh + u is an integer (and column
    likewise) of w[o, c, i, j] * gy[n, o, e_i + u, f_j + v]: a correlation
    of gy with the transposed filter, rows c, staged channels o.
    """
    sm_count = sm_count or _sm_count()
    key = ("cuda_backward", g, sm_count, blocks_per_sm)
    cached = csr.cache.get(key)
    if cached is not None:
        return cached
    (sh, sw), (dh, dw) = g.stride, g.dilation
    top, _, left, _ = g.padding
    phases, order, start = [], [], 0
    for a in range(sh):
        for b in range(sw):
            u, v = -(-(g.h - a) // sh), -(-(g.w - b) // sw)
            if u <= 0 or v <= 0:
                continue
            rows_e, cols_f = _phase_taps(a, top, g.kh, dh, sh), _phase_taps(b, left, g.kw, dw, sw)
            if rows_e and cols_f:
                e_min, f_min = min(rows_e.values()), min(cols_f.values())
                span_h = max(rows_e.values()) - e_min + 1
                span_w = max(cols_f.values()) - f_min + 1
                e = np.array([rows_e.get(i, 0) for i in range(g.kh)])
                f = np.array([cols_f.get(j, 0) for j in range(g.kw)])
                hit = (np.isin(csr.tap_row, list(rows_e)) & np.isin(csr.tap_col, list(cols_f)))
                entries = np.flatnonzero(hit)
                di = e[csr.tap_row[entries]] - e_min
                dj = f[csr.tap_col[entries]] - f_min
                # Sorted by gx channel c, then gy channel o, then shift.
                sort = np.lexsort((dj, di, csr.rows[entries], csr.channel[entries]))
                entries, di, dj = entries[sort], di[sort], dj[sort]
            else:       # no tap reaches these gx pixels: the kernel writes zeros
                e_min = f_min = 0
                span_h = span_w = 1
                entries = di = dj = np.zeros(0, np.int64)
            tiling = choose_tiling(g.n, g.c_in, g.c_out, u, v, 1, 1, span_h, span_w, sm_count,
                                   blocks_per_sm)
            plan = TilePlan(tiling, csr.channel[entries], g.c_in, g.c_out, csr.rows[entries],
                            di, dj,
                            (g.c_out, g.oh, g.ow, g.c_in, g.h, g.w, u, v, e_min, f_min,
                             a, b, sh, sw))
            phases.append((plan, start))
            order.append(entries)
            start += entries.size
    index = np.concatenate(order).astype(np.int32) if order else np.zeros(0, np.int32)
    cached = csr.cache[key] = (phases, index)
    return cached


def _ptr(array, elements=0):
    return array.ptr + FLOAT * elements


def forward_cuda(g, csr, x, values, bias=None):
    """y [N, C_out, OH, OW] with one launch of sparse_conv_forward (plus packing, see entries)."""
    y = cuda.empty(g.y_shape)
    plan = forward_plan(g, csr)
    plan.forward(g.n, x.ptr, plan.entries(values).ptr, 0 if bias is None else bias.ptr, y.ptr)
    return y


def backward_data_cuda(g, csr, gy, values):
    """gx [N, C_in, H, W]: the values gathered into transposed order, then one launch per phase."""
    phases, index = backward_plans(g, csr)
    gx = cuda.empty(g.x_shape)
    total = index.size
    entries = cuda.empty((2 * max(total, 1),))
    if total:
        key = ("cuda_backward_index", g)
        device = csr.cache.get(key)
        if device is None:
            from gdnflow.backends.cuda.runtime import get_runtime
            runtime = get_runtime()
            offsets = np.concatenate([plan.offsets_host for plan, _ in phases])
            device = csr.cache[key] = (runtime.from_numpy(index), runtime.from_numpy(offsets))
        cuda.kernel(SOURCE, "gather_pack", "PPPPi").launch(
            total, values.ptr, device[0].ptr, device[1].ptr, entries.ptr, total)
    for plan, start in phases:
        plan.forward(g.n, gy.ptr, _ptr(entries, 2 * start), 0, gx.ptr)
    return gx


def backward_values_cuda(g, csr, x, gy):
    """gvalues [nnz]: zeroed, then one launch of sparse_conv_values_grad."""
    from gdnflow.backends.cuda.runtime import get_runtime
    gvalues = get_runtime().full((csr.nnz,), 0.0, np.float32)
    if csr.nnz:
        forward_plan(g, csr).values_grad(g.n, x.ptr, gy.ptr, gvalues.ptr)
    return gvalues


# --------------------------------------------------------------- operator --
@register("sparse_conv2d")
class SparseConv2dOp(Operator):
    """y = conv(x, the CSR filter with ``values``) + b; see the module docstring.

    Inputs: x [N, C_in, H, W], values [nnz] (the filter's entries, in CSR
    order) and, when ``has_bias``, b [C_out]. The CSRWeight fixes the
    pattern; its stored offsets may be for any padded size (they are
    recomputed for this input's).
    """

    def __init__(self, weight, stride=1, padding=0, has_bias=False):
        if not isinstance(weight, CSRWeight):
            raise TypeError(f"sparse_conv2d: weight must be a CSRWeight (see "
                            f"gdnflow.sparse.to_csr), got {type(weight).__name__}")
        self.weight = weight
        self.stride, self.padding, _, _ = conv_parameters("sparse_conv2d", stride, padding, 1, 1)
        self.has_bias = bool(has_bias)

    def check(self, x, values, *extras):
        if len(extras) != self.has_bias:
            raise TypeError(f"{self.label}: expected {2 + self.has_bias} input tensors, "
                            f"got {2 + len(extras)}")
        self.geometry = g = sparse_geometry(self.label, x.shape, self.weight, self.stride,
                                            self.padding)
        if values.shape != (self.weight.nnz,):
            raise ShapeError(f"{self.label}: values must have shape ({self.weight.nnz},) (the "
                             f"filter's entries), got {values.shape}")
        if self.has_bias and extras[0].shape != (g.c_out,):
            raise ShapeError(f"{self.label}: bias must have shape ({g.c_out},), "
                             f"got {extras[0].shape}")
        recording = grad_enabled() and any(t.requires_grad for t in (x, values) + extras)
        self.keep = (recording and values.requires_grad, recording and x.requires_grad)

    def _forward(self, x, values, *extras):
        keep_x, keep_values = self.keep
        self.saved = (x if keep_x else None, values if keep_values else None)
        bias = extras[0] if self.has_bias else None
        return self.dispatch("run_forward", x, values, bias)

    forward_numpy = forward_cuda = _forward

    def run_forward_numpy(self, x, values, bias):
        return forward_numpy(self.geometry, self.weight, x, values, bias)

    def run_forward_cuda(self, x, values, bias):
        return forward_cuda(self.geometry, self.weight, x, values, bias)

    def backward(self, grad_output):
        g, csr = self.geometry, self.weight
        x, values = self.saved
        gy = grad_output.data
        need = self.needs_grad
        numpy = self.device == "numpy"
        gx = gvalues = gbias = None
        if need[0]:
            gx = (backward_data_numpy if numpy else backward_data_cuda)(g, csr, gy, values)
        if need[1]:
            gvalues = (backward_values_numpy if numpy else backward_values_cuda)(g, csr, x, gy)
        if self.has_bias and need[2]:
            if numpy:
                gbias = gy.sum(axis=(0, 2, 3))
            else:
                from gdnflow.ops.reduction import sum_cuda
                gbias = sum_cuda(gy, (0, 2, 3), 1.0).reshape((g.c_out,))
        grads = [gx, gvalues] + ([gbias] if self.has_bias else [])
        return tuple(None if a is None else self.wrap(a) for a in grads)


def values_tensor(weight, device, dtype=np.float32):
    """The CSR's stored values as a constant tensor on ``device`` (cached in the CSR)."""
    from gdnflow.tensor import Tensor
    key = ("values", device, np.dtype(dtype).str)
    tensor = weight.cache.get(key)
    if tensor is None:
        tensor = weight.cache[key] = Tensor(weight.values, device=device, dtype=dtype)
    return tensor


def sparse_conv2d(x, weight, values=None, bias=None, stride=1, padding=0):
    """Direct sparse convolution of x [N, C_in, H, W] with the CSR filter ``weight``.

    ``y[n, o, p, q] = b[o] + sum_{(c, i, j) in row o} w[o, c, i, j] * x[n, c,
    p*sh - top + i*dh, q*sw - left + j*dw]`` (zero outside x), the same
    function as :func:`gdnflow.ops.conv2d` with ``weight.to_dense()``;
    y is [N, C_out, OH, OW] with OH = floor((H + top + bottom - dh*(kh-1) - 1)/sh) + 1.

    ``weight``: a :class:`~gdnflow.sparse.csr.CSRWeight` (from
    :func:`~gdnflow.sparse.csr.to_csr`; dilation is part of it). ``values``:
    a tensor [nnz] of the entries, differentiable; None uses the CSR's own
    values as a constant. ``bias`` [C_out] is optional. ``stride``: an int
    or (sh, sw); ``padding``: an int, (ph, pw) or (top, bottom, left, right).
    Gradients reach x, values and bias.
    """
    if values is None and isinstance(weight, CSRWeight):
        values = values_tensor(weight, x.device, x.dtype)
    op = SparseConv2dOp(weight, stride, padding, has_bias=bias is not None)
    return op(*((x, values) if bias is None else (x, values, bias)))


def random_csr(shape, density, padded, dilation=1, rng=None):
    """A CSRWeight with a uniformly random pattern of ``density`` and N(0, 1/fan_in) values."""
    rng = rng or np.random.default_rng(0)
    size = math.prod(shape)
    keep = np.zeros(size, bool)
    keep[rng.choice(size, int(round(density * size)), replace=False)] = True
    w = rng.standard_normal(size).astype(np.float32) / math.sqrt(math.prod(shape[1:]))
    from gdnflow.sparse.csr import to_csr
    return to_csr(w.reshape(shape), padded, dilation, mask=keep.reshape(shape))
