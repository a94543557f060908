"""NumPy models of the phase split of an NCHW tensor and its inverse, the
layout of the sub-pixel rewrite (gdnflow/ops/conv/algorithms/subpixel.py, cuda_src/subpixel.cu
and the phase views of cuda_src/winograd.cu), for the tests of both."""
import numpy as np


def split_phases(x, sh, sw, cells_h, cells_w):
    """x' [N, sh*sw*C, cells_h, cells_w]: channel (rh*sw + rw)*C + c, cell (i, j)
    = x[n, c, i*sh + rh, j*sw + rw], zero past x's edge."""
    n, c, h, w = x.shape
    padded = np.zeros((n, c, cells_h * sh, cells_w * sw), x.dtype)
    padded[:, :, :h, :w] = x
    return np.concatenate([padded[:, :, rh::sh, rw::sw] for rh in range(sh) for rw in range(sw)],
                          axis=1)


def interleave_phases(x_sub, sh, sw, h, w):
    """x [N, C, h, w] from its phases x' (the cells past the edge dropped)."""
    n, channels, cells_h, cells_w = x_sub.shape
    c = channels // (sh * sw)
    full = np.empty((n, c, cells_h * sh, cells_w * sw), x_sub.dtype)
    for rh in range(sh):
        for rw in range(sw):
            phase = rh * sw + rw
            full[:, :, rh::sh, rw::sw] = x_sub[:, phase * c:(phase + 1) * c]
    return full[:, :, :h, :w]
