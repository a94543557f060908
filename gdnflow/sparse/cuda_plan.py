"""The GPU path of :func:`~gdnflow.sparse.conv.sparse_conv2d`: tile plans and their launches.

The kernels are in ``cuda_src/sparse_conv.cu``; their variant (tile shape)
comes from :func:`~gdnflow.sparse.tiling.choose_tiling`, sized for
``gdnflow.config.settings.sparse_blocks_per_sm`` resident blocks per SM.

- forward (:func:`forward_cuda`): one tiled kernel; input planes are staged
  in shared memory ``cc`` at a time, borders zero-filled while staging (no
  padded copy of x), and the inner loop reads the tile at the CSR offsets
  retargeted to the tile's own padded size (:class:`TilePlan`).
- backward-data (:func:`backward_data_cuda`): the same kernel run on gy
  with the transposed, flipped filter, once per stride phase: the gx pixels
  with h = a (mod sh), w = b (mod sw) receive exactly the taps with
  (a + top - i*dh) divisible by sh (and the same along w), and for them the
  transpose is again a gather (a stride-1 correlation of gy), so every gx
  element is written once, with no atomics (:func:`backward_plans`). The
  transposed CSRs are built once per (filter, geometry) on the host; each
  backward gathers the values into their order with one launch.
- backward-values (:func:`backward_values_cuda`): a reduction per entry with
  the forward's tiling, each warp's partial dot product summed with shuffles
  and added with one atomic per entry and tile.

Plans are cached in the CSRWeight's ``cache``, keyed by geometry, SM count
and blocks per SM. Arrays are float32 device arrays of the backend facade
(:mod:`gdnflow.backends.cuda`), C-contiguous NCHW.
"""
import numpy as np

from gdnflow.backends import cuda
from gdnflow.config import settings
from gdnflow.tensor import weights_version
from gdnflow.sparse.tiling import WARPS, choose_tiling

SOURCE = "sparse_conv.cu"


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
        """The grid size for n images."""
        return n * self.groups * self.tiles_u * self.tiles_v

    @property
    def device_arrays(self):
        """(offsets, chunk_ptr) on the GPU, uploaded once."""
        if self._device is None:
            runtime = cuda.get_runtime()
            # One int32 element at least: an empty filter still gets a valid pointer.
            self._device = (runtime.from_numpy(np.append(self.offsets_host, 0).astype(np.int32)),
                            runtime.from_numpy(self.chunk_ptr_host))
        return self._device

    def entries(self, values):
        """The kernel's (value, offset) pairs for ``values`` (a CudaArray in this plan's order).

        Packed by one launch, and kept while the same array holds the same
        weights (:func:`~gdnflow.tensor.weights_version` unchanged), so a
        layer's constant values are packed once.
        """
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
        """gvalues += the values' gradient from the input and gout (see sparse_conv.cu)."""
        if self.blocks(n) == 0:
            return
        c_in, ih, iw, c_out, oh, ow, _, _, row0, col0 = self.geometry[:10]
        kernel = cuda.kernel(SOURCE, "sparse_conv_values_grad", "PPPPP" + "i" * 12,
                             self.tiling.defines)
        offsets, chunk_ptr = self.device_arrays
        kernel((self.blocks(n), 1, 1), (WARPS * 32, 1, 1), in_ptr, gout_ptr, offsets.ptr,
               chunk_ptr.ptr, gvalues_ptr, c_in, ih, iw, c_out, oh, ow, row0, col0,
               self.groups, self.tiles_u, self.tiles_v, self.n_chunks)


def forward_plan(g, csr, sm_count=None):
    """The forward's :class:`TilePlan` (cached in the CSR per geometry and SM count)."""
    sm_count = sm_count or cuda.sm_count()
    blocks_per_sm = settings.sparse_blocks_per_sm
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
    sm_count = sm_count or cuda.sm_count()
    blocks_per_sm = settings.sparse_blocks_per_sm
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
            runtime = cuda.get_runtime()
            offsets = np.concatenate([plan.offsets_host for plan, _ in phases])
            device = csr.cache[key] = (runtime.from_numpy(index), runtime.from_numpy(offsets))
        cuda.kernel(SOURCE, "gather_pack", "PPPPi").launch(
            total, values.ptr, device[0].ptr, device[1].ptr, entries.ptr, total)
    for plan, start in phases:
        phase_entries = entries.offset(2 * start, (2 * plan.offsets_host.size,))
        plan.forward(g.n, gy.ptr, phase_entries.ptr, 0, gx.ptr)
    return gx


def backward_values_cuda(g, csr, x, gy):
    """gvalues [nnz]: zeroed, then one launch of sparse_conv_values_grad."""
    gvalues = cuda.zeros((csr.nnz,))
    if csr.nnz:
        forward_plan(g, csr).values_grad(g.n, x.ptr, gy.ptr, gvalues.ptr)
    return gvalues
