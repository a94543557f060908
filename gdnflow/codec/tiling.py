"""The codec's transforms run tile by tile, with the halo each tile's receptive field needs.

A latent (or pixel) computed from a crop of its input equals the one
computed from the whole input when every input it depends on lies in the
crop or outside the whole input (where both see the same zero padding).
:func:`input_span` derives that dependency from the layers' geometry:

* a convolution (kernel k, stride s, padding p): output o reads the
  (unpadded) inputs ``[s*o - p, s*o - p + k - 1]``;
* a transposed convolution: output i receives input o where
  ``i = s*o - p + t`` for a tap t in ``[0, k - 1]``, so
  ``o in [ceil((i + p - k + 1) / s), floor((i + p) / s)]``;
* anything else (GDN, IGDN) is pointwise in space.

For the factorized prior (four 5x5 stride-2 padding-2 layers each way) that
gives: latent o depends on the pixels ``[16 o - 30, 16 o + 30]``, and
pixel i on the latents ``[ceil((i - 30) / 16), floor((i + 30) / 16)]``
(at most 2 on each side of ``i // 16``).

Crops start at multiples of the total stride so that each layer's crop
covers whole positions of the layer below: a tile's output is then the same
sum of the same products as the whole image's. What is exact, what is not:
the tile's arithmetic differs from the whole image's only in the size of the
matrix products (BLAS may block a product's sum differently by its shape),
so tiled and untiled latents agree to float32 rounding (a few ulps), and
the integers q = round(y - median) are identical unless a value lies within
those ulps of a rounding boundary. An image that fits in one tile is
computed exactly as untiled (one crop: the whole image).
"""
import math

import numpy as np

from gdnflow.nn.conv import Conv2d, ConvTranspose2d


def _square(value, what, layer):
    """The one number of an int or of a pair of equal ints; ValueError otherwise."""
    values = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if len(set(values)) != 1:
        raise ValueError(f"tiling: {layer!r} has {what} {value}: only square, symmetric "
                         "geometry is supported")
    return int(values[0])


def layer_geometry(layer):
    """(kind, kernel, stride, padding) of a layer along either axis; kind is None if pointwise.

    ``kind`` is "conv" or "transpose". Raises ValueError for a dilated or
    non-square convolution (the codec's models have none).
    """
    if not isinstance(layer, (Conv2d, ConvTranspose2d)):
        return None, 1, 1, 0
    if _square(layer.dilation, "dilation", layer) != 1:
        raise ValueError(f"tiling: {layer!r} is dilated")
    kernel = _square(tuple(layer.weight.shape[2:]), "kernel", layer)
    kind = "conv" if isinstance(layer, Conv2d) else "transpose"
    return (kind, kernel, _square(layer.stride, "stride", layer),
            _square(layer.padding, "padding", layer))


def input_span(layers, first, last):
    """The input positions [lo, hi] that outputs [first, last] of ``layers`` (in order) read.

    Along one axis, in the coordinates of the whole input (lo may be
    negative and hi past the end: those are the layers' zero padding).
    """
    for layer in reversed(list(layers)):
        kind, k, s, p = layer_geometry(layer)
        if kind == "conv":
            first, last = s * first - p, s * last - p + k - 1
        elif kind == "transpose":
            first, last = -((k - 1 - p - first) // s), (last + p) // s
    return first, last


def total_stride(layers):
    """The product of the layers' strides: how many positions of one side make one of the other."""
    return math.prod(layer_geometry(layer)[2] for layer in layers)


def tile_ranges(size, tile):
    """[(start, stop)] cutting ``range(size)`` into consecutive pieces of ``tile`` (last shorter)."""
    tile = size if tile is None else max(int(tile), 1)
    return [(start, min(start + tile, size)) for start in range(0, size, tile)]


def analysis_crop(layers, first, stop, padded_size):
    """(crop start, crop stop) of the padded image for latents [first, stop) along one axis.

    The crop holds every pixel those latents read, widened to multiples of
    the total stride and clipped to the padded image.
    """
    stride = total_stride(layers)
    lo, hi = input_span(layers, first, stop - 1)
    return max(0, lo // stride * stride), min(padded_size, -(-(hi + 1) // stride) * stride)


def synthesis_crop(layers, first, stop, latent_size):
    """(crop start, crop stop) of the latents that make pixels [first, stop) along one axis."""
    lo, hi = input_span(layers, first, stop - 1)
    return max(0, lo), min(latent_size, hi + 1)


def reflected_indices(size, padded_size):
    """Source index of each position of a side reflection-padded from ``size`` to ``padded_size``.

    Exactly numpy.pad's "reflect" (which reflects again when the pad is
    longer than the side), as :func:`gdnflow.data.images.pad_to_multiple` pads.
    """
    return np.pad(np.arange(size), (0, padded_size - size), mode="reflect")
