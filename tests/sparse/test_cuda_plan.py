"""The CUDA path's plans (gdnflow.sparse.cuda_plan) without a GPU: a block-by-block replay of
the kernels from the plans' host arrays, and the host code run on a simulated device."""
from types import SimpleNamespace

import numpy as np
import pytest

import gdnflow as gf
from gdnflow.backends import cuda
from gdnflow.sparse import cuda_plan, reference
from gdnflow.sparse.csr import to_csr
from gdnflow.sparse.cuda_plan import backward_plans, forward_plan
from gdnflow.sparse.tiling import WARPS, Tiling
from gdnflow.testing import relative_error
from sparse_cases import CASES, case, geometry_of, pruned_weight


# ------------------------------------ replay of the CUDA plans on NumPy --
def _lane_layout(tiling):
    """Local output rows and columns of the lanes (rows: ly*ROWS + r, as in the kernel)."""
    ly = 32 // tiling.tw
    rows = (np.arange(ly)[:, None] * tiling.rows + np.arange(tiling.rows)[None, :]).ravel()
    return rows, np.arange(tiling.tw)


def _stage(plan, image, ch, u0, v0):
    """stage_tile: CC planes of IN_H x IN_W at the block's window, zero outside, pitch PITCH."""
    t = plan.tiling
    c_in, ih, iw = plan.geometry[:3]
    row0, col0 = plan.geometry[8:10]
    c = ch * t.cc + np.arange(t.cc)[:, None, None]
    h = u0 * t.sh + row0 + np.arange(t.in_h)[None, :, None]
    w = v0 * t.sw + col0 + np.arange(t.in_w)[None, None, :]
    inside = (c < c_in) & (h >= 0) & (h < ih) & (w >= 0) & (w < iw)
    tile = np.zeros((t.cc, t.in_h, t.pitch))
    tile[:, :, :t.in_w] = np.where(
        inside, image[np.minimum(c, c_in - 1), np.clip(h, 0, ih - 1), np.clip(w, 0, iw - 1)], 0)
    return tile.ravel()


def _blocks(plan, n_images):
    t = plan.tiling
    for n in range(n_images):
        for tu in range(plan.tiles_u):
            for tv in range(plan.tiles_v):
                for group in range(plan.groups):
                    channels = range(group * WARPS * t.cpw, (group + 1) * WARPS * t.cpw)
                    yield n, tu * t.th, tv * t.tw, channels


def _write(out, n, o, row_index, col_index, values):
    out[n, o][np.ix_(row_index, col_index)] = values


def replay(plan, inp, values, out):
    """out <- what sparse_conv_forward computes (no bias) from the plan's host arrays.

    Stages each block's tiles as stage_tile does and reads them where the
    lanes read, so an offset that leaves its staged tile fails (IndexError).
    """
    t = plan.tiling
    _, _, _, c_out, _, _, u_ext, v_ext, _, _, out_row0, out_col0, out_sh, out_sw = plan.geometry
    cp = plan.chunk_ptr_host.reshape(c_out, plan.n_chunks + 1)
    rows, cols = _lane_layout(t)
    where = rows[:, None] * t.sh * t.pitch + cols[None, :] * t.sw
    for n, u0, v0, channels in _blocks(plan, inp.shape[0]):
        channels = [o for o in channels if o < c_out]
        acc = {o: np.zeros(where.shape) for o in channels}
        for ch in range(plan.n_chunks):
            tile = _stage(plan, inp[n], ch, u0, v0)
            for o in channels:
                for k in range(cp[o, ch], cp[o, ch + 1]):
                    acc[o] += values[k] * tile[plan.offsets_host[k] + where]
        keep_r, keep_c = u0 + rows < u_ext, v0 + cols < v_ext
        for o in channels:
            _write(out, n, o, out_row0 + (u0 + rows[keep_r]) * out_sh,
                   out_col0 + (v0 + cols[keep_c]) * out_sw, acc[o][np.ix_(keep_r, keep_c)])


def replay_values_grad(plan, inp, gout):
    """What sparse_conv_values_grad accumulates into a zeroed gvalues."""
    t = plan.tiling
    c_out, oh, ow = plan.geometry[3:6]
    cp = plan.chunk_ptr_host.reshape(c_out, plan.n_chunks + 1)
    gvalues = np.zeros(plan.offsets_host.size)
    rows, cols = _lane_layout(t)
    where = rows[:, None] * t.sh * t.pitch + cols[None, :] * t.sw
    for n, u0, v0, channels in _blocks(plan, inp.shape[0]):
        u, v = u0 + rows[:, None], v0 + cols[None, :]
        inside = (u < oh) & (v < ow)
        for ch in range(plan.n_chunks):
            tile = _stage(plan, inp[n], ch, u0, v0)
            for o in (o for o in channels if o < c_out):
                g = np.where(inside, gout[n, o][np.minimum(u, oh - 1), np.minimum(v, ow - 1)], 0)
                for k in range(cp[o, ch], cp[o, ch + 1]):
                    gvalues[k] += np.sum(g * tile[plan.offsets_host[k] + where])
    return gvalues


@pytest.mark.parametrize("per_sm", [1, 64])
@pytest.mark.parametrize("name", CASES)
def test_cuda_plans_replayed_on_numpy_match_the_reference(name, per_sm, rng):
    # What the kernels would compute from the plans' offsets, chunk pointers,
    # windows and (backward) stride phases, block by block, for two tilings.
    with gf.config.override(sparse_blocks_per_sm=per_sm):
        x, w, csr, kwargs, _ = case(rng, name, 0.6)
        g = geometry_of(x.shape, csr, kwargs)
        values = csr.values.astype(np.float64)
        y_ref = reference.forward_numpy(g, csr, x, values)
        y = np.full(g.y_shape, np.nan)
        replay(forward_plan(g, csr, sm_count=1), x, values, y)
        assert relative_error(y, y_ref) <= 1e-12

        gy = rng.standard_normal(g.y_shape)
        phases, index = backward_plans(g, csr, sm_count=1)
        assert sorted(index.tolist()) == sorted(set(index.tolist()))     # each entry at most once
        gx = np.full(g.x_shape, np.nan)
        for plan, start in phases:
            replay(plan, gy, values[index][start:], gx)
        assert relative_error(gx, reference.backward_data_numpy(g, csr, gy, values)) <= 1e-12

        gv = replay_values_grad(forward_plan(g, csr, sm_count=1), x, gy)
        assert relative_error(gv, reference.backward_values_numpy(g, csr, x, gy)) <= 1e-12


@pytest.mark.parametrize("per_sm,cpw,groups", [(1, 4, 3), (64, 1, 9)])
def test_replay_with_several_chunks_and_channel_groups(per_sm, cpw, groups, rng):
    # 40 input channels (3 chunks of 16), 70 output channels in groups of 8*cpw.
    x = rng.standard_normal((1, 40, 6, 7))
    csr = to_csr(pruned_weight(rng, (70, 40, 3, 3), 0.9), (8, 9))
    g = geometry_of(x.shape, csr, dict(padding=1))
    with gf.config.override(sparse_blocks_per_sm=per_sm):
        plan = forward_plan(g, csr, sm_count=1)
    assert plan.n_chunks == 3 and plan.groups == groups and plan.tiling.cpw == cpw
    values = csr.values.astype(np.float64)
    y = np.full(g.y_shape, np.nan)
    replay(plan, x, values, y)
    assert relative_error(y, reference.forward_numpy(g, csr, x, values)) <= 1e-12


# ------------------- the CUDA path's host side, on a simulated device --
class _FakeDevice:
    """Device memory as NumPy buffers at fake addresses, and the five kernels of
    sparse_conv.cu replayed on it: enough to run forward_cuda, backward_data_cuda
    and backward_values_cuda (argument order, pointer offsets, packing, phases)
    on a machine without a GPU."""

    sm_count = 132

    def __init__(self):
        self.blocks, self.next = {}, 1 << 20

    # memory
    def _view(self, ptr, dtype, count):
        if count == 0:                  # a kernel given no entries never reads the pointer
            return np.zeros(0, dtype)
        for base, buf in self.blocks.items():
            if base <= ptr < base + buf.size:
                start = ptr - base
                return buf[start:start + count * np.dtype(dtype).itemsize].view(dtype)
        raise AssertionError(f"address {ptr:#x} is in no allocation")

    def empty(self, shape, dtype=np.float32):
        dtype = np.dtype(dtype)
        size = int(np.prod(shape))
        buf = np.zeros(max(size, 1) * dtype.itemsize, np.uint8)
        if dtype == np.float32:
            buf.view(np.float32)[:] = np.nan                  # poisoned, as in the tests' runtime
        base, self.next = self.next, self.next + buf.size + 512
        self.blocks[base] = buf
        return _FakeArray(self, tuple(shape), dtype, base)

    def full(self, shape, value, dtype=np.float32):
        array = self.empty(shape, dtype)
        array.host()[...] = value
        return array

    def from_numpy(self, host):
        array = self.empty(host.shape, host.dtype)
        array.host()[...] = host
        return array

    # the kernels module's interface
    def get_runtime(self):
        return self

    def launch_grid(self, threads, block=256, blocks_per_sm=16):
        return ((threads + block - 1) // block, 1, 1)

    def kernel(self, file, name, arg_types, defines=()):
        assert file == "sparse_conv.cu" and len(arg_types) == {
            "sparse_conv_forward": 23, "sparse_conv_values_grad": 17, "pack_entries": 4,
            "gather_pack": 5, "multiply_in_place": 3}[name], (name, arg_types)
        return _FakeKernel(self, name, dict(defines))


class _FakeArray:
    def __init__(self, device, shape, dtype, ptr):
        self.device, self.shape, self.dtype, self.ptr = device, shape, dtype, ptr
        self.size = int(np.prod(shape))

    def host(self):
        return self.device._view(self.ptr, self.dtype, self.size).reshape(self.shape)

    def reshape(self, shape):
        return _FakeArray(self.device, tuple(shape), self.dtype, self.ptr)

    def offset(self, elements, shape):
        return _FakeArray(self.device, tuple(shape), self.dtype,
                          self.ptr + elements * self.dtype.itemsize)


class _FakeKernel:
    def __init__(self, device, name, defines):
        self.device, self.name, self.defines = device, name, defines

    def launch(self, threads, *args, **_):
        self((0, 1, 1), (256, 1, 1), *args)

    def _plan(self, ints, grid, forward):
        d = self.defines
        tiling = Tiling(d["TW"], d["ROWS"], d["CPW"], d["CC"], d["SH"], d["SW"], d["SPAN_H"],
                        d["SPAN_W"], d["PITCH"])
        if forward:
            geometry, (groups, tiles_u, tiles_v, n_chunks) = tuple(ints[:14]), ints[14:]
        else:
            c_in, ih, iw, c_out, oh, ow, row0, col0, groups, tiles_u, tiles_v, n_chunks = ints
            geometry = (c_in, ih, iw, c_out, oh, ow, oh, ow, row0, col0, 0, 0, 1, 1)
        n_images = grid[0] // (groups * tiles_u * tiles_v)
        return SimpleNamespace(tiling=tiling, geometry=geometry, groups=groups, tiles_u=tiles_u,
                               tiles_v=tiles_v, n_chunks=n_chunks), n_images

    def __call__(self, grid, block, *args, shared_bytes=0):
        view = self.device._view
        if self.name == "pack_entries":
            values, offsets, entries, n = args
            e = view(entries, np.float32, 2 * n)
            e[0::2] = view(values, np.float32, n)
            e.view(np.int32)[1::2] = view(offsets, np.int32, n)
        elif self.name == "gather_pack":
            values, index, offsets, entries, n = args
            idx = view(index, np.int32, n)
            e = view(entries, np.float32, 2 * n)
            e[0::2] = view(values, np.float32, int(idx.max()) + 1)[idx]
            e.view(np.int32)[1::2] = view(offsets, np.int32, n)
        elif self.name == "multiply_in_place":
            a, b, n = args
            view(a, np.float32, n)[:] *= view(b, np.float32, n)
        elif self.name == "sparse_conv_forward":
            inp, entries, chunk_ptr, bias, out, *ints = args
            plan, n = self._plan(ints, grid, forward=True)
            c_in, ih, iw, c_out, oh, ow = plan.geometry[:6]
            plan.chunk_ptr_host = view(chunk_ptr, np.int32, c_out * (plan.n_chunks + 1))
            nnz = int(plan.chunk_ptr_host.max())
            e = view(entries, np.float32, 2 * nnz)
            plan.offsets_host = e.view(np.int32)[1::2]
            y = view(out, np.float32, n * c_out * oh * ow).reshape(n, c_out, oh, ow)
            replay(plan, view(inp, np.float32, n * c_in * ih * iw).reshape(n, c_in, ih, iw),
                   e[0::2].astype(np.float64), y)
            if bias:
                y += view(bias, np.float32, c_out).reshape(1, -1, 1, 1)
        elif self.name == "sparse_conv_values_grad":
            inp, gout, offsets, chunk_ptr, gvalues, *ints = args
            plan, n = self._plan(ints, grid, forward=False)
            c_in, ih, iw, c_out, oh, ow = plan.geometry[:6]
            plan.chunk_ptr_host = view(chunk_ptr, np.int32, c_out * (plan.n_chunks + 1))
            nnz = int(plan.chunk_ptr_host.max())
            plan.offsets_host = view(offsets, np.int32, nnz)
            view(gvalues, np.float32, nnz)[:] += replay_values_grad(
                plan, view(inp, np.float32, n * c_in * ih * iw).reshape(n, c_in, ih, iw),
                view(gout, np.float32, n * c_out * oh * ow).reshape(n, c_out, oh, ow))


@pytest.fixture
def fake_device():
    device = _FakeDevice()
    with cuda.simulated(device):
        yield device


@pytest.mark.parametrize("name", ["s1_p1", "s2_asymmetric", "rect_stride_5x5", "dilation2",
                                  "1x1_s2", "padding_past_kernel"])
def test_cuda_host_code_on_a_simulated_device(name, rng, fake_device):
    x, w, csr, kwargs, _ = case(rng, name, 0.7)
    g = geometry_of(x.shape, csr, kwargs)
    b = rng.standard_normal(g.c_out).astype(np.float32)
    gy = rng.standard_normal(g.y_shape).astype(np.float32)
    values = csr.values.astype(np.float64)
    dx, dgy, dv, db = (fake_device.from_numpy(a.astype(np.float32))
                       for a in (x, gy, csr.values, b))
    y = cuda_plan.forward_cuda(g, csr, dx, dv, db).host()
    assert relative_error(y, reference.forward_numpy(g, csr, x, values, b)) <= 1e-5
    gx = cuda_plan.backward_data_cuda(g, csr, dgy, dv).host()
    assert relative_error(gx, reference.backward_data_numpy(g, csr, gy, values)) <= 1e-5
    gv = cuda_plan.backward_values_cuda(g, csr, dx, dgy).host()
    assert relative_error(gv, reference.backward_values_numpy(g, csr, x, gy)) <= 1e-5
    # A second forward reuses the packed entries of the same values array.
    plan = cuda_plan.forward_plan(g, csr)
    packed = plan.entries(dv)
    assert plan.entries(dv) is packed
    np.testing.assert_allclose(cuda_plan.forward_cuda(g, csr, dx, dv, db).host(), y)
