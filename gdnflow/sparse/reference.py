"""The NumPy reference of :func:`~gdnflow.sparse.conv.sparse_conv2d`: forward and both backwards.

With g the convolution's geometry (:func:`~gdnflow.sparse.geometry.sparse_geometry`),
xp the input padded to Hp x Wp and the CSR's offsets retargeted to that size
(see :mod:`gdnflow.sparse.csr`)::

    y[n, o].flat[p*OW + q] = sum_{k in row o} values[k] * xp[n].flat[offsets[k] + p*sh*Wp + q*sw]

Vectorised over the entries of a block of rows (at most :data:`NUMPY_BLOCK`
gathered elements at once):

- forward: gather xp at offsets + pixel bases, scale, reduce per row;
- backward-data: the transpose: scatter-add the same products (bincount);
- backward-values: gather and contract with gy over images and pixels.

Arrays are NumPy arrays of any float dtype; results take the inputs' result type.
"""
import numpy as np

from gdnflow.sparse.geometry import padded_size

#: Elements of the gathered [N, entries, pixels] block the NumPy code handles at once.
NUMPY_BLOCK = 1 << 21


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
