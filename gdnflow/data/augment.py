"""How training crops vary: flips, and a random downscale of the image before the crop.

A few hundred megapixels of photographs give many more distinct training crops
when each crop may be mirrored and taken from the image shrunk by a random
factor: a 256x256 crop of a 5120x2880 photo downscaled 4 times covers what a
1024x1024 crop of the original does, and the downscale also averages away the
noise and JPEG artefacts of the source. :class:`Augmentation` says what is done:

- ``flip``: ``"horizontal"`` (the default, as gdnflow always did: a mirror
  image, left to right, half the time), ``"both"`` (also, independently, upside
  down half the time: photographs are seldom symmetric that way, so it is an
  option, not the default) or ``"none"``.
- ``scale_range`` = (low, high) with 0 < low <= high <= 1: each sample's image is
  first downscaled by a factor s drawn log-uniformly from [low, high] (every
  octave equally often), raised where needed so that the scaled image still
  holds the crop (s >= crop / min(H, W); images smaller than the crop are
  padded as before, never scaled). The default (1, 1) never scales.

The downscale is Pillow's antialiased Lanczos resampling (its filter widened by
the factor, so every source pixel counts: no aliasing) in 8 bits per channel,
as a photo downscaled and saved would be. Only the crop is computed
(:func:`resampled_crop`: Pillow's resize of an image to the crop's box, which
reads only the rows and columns under the filter). So that a large factor
does not read a large region for every crop, each image is also kept at the
scales 2^-k/2 it is needed at (made on first use from the image, or from the
level two steps up, and cached by :class:`~gdnflow.data.images.ImageFolder`),
and a crop of scale s is resampled from level :func:`pyramid_level` (s): the
smallest scale at least s, so the crop is shrunk by at most sqrt(2) more.
Above 2^-1/2 that is the crop of the whole image resized (within rounding);
below, one or two more Lanczos passes sit between them: on the corpus's
photos about 0.6-0.8 levels of 255 RMS, single pixels up to about 17.

Every draw is a function of the run's seed, the step and the sample's place in
the batch (see :mod:`gdnflow.data.images`), so a resumed run sees exactly the
crops of the uninterrupted one. The horizontal flip keeps its old draw from the
crop generator; the scale and the vertical flip come from a generator of their
own, so a run with the default augmentation draws exactly the crops it drew
before these options existed.
"""
import dataclasses
import math

import numpy as np
from PIL import Image

#: The ratio between consecutive scales at which an image is kept for downscaled crops
#: (see the module docstring): a crop's own resampling shrinks it by at most 1 / this.
PYRAMID_STEP = 2 ** -0.5
#: The choices of ``Augmentation.flip``.
FLIPS = ("none", "horizontal", "both")
#: Bits of a sample's flip code: mirrored left to right, upside down.
HORIZONTAL, VERTICAL = 1, 2


@dataclasses.dataclass(frozen=True)
class Augmentation:
    """Flips and random downscaling of training crops (see the module docstring).

    ``Augmentation(flip="horizontal", scale_range=(1.0, 1.0))`` is what gdnflow
    did before these options existed. Raises ValueError naming the field,
    what it accepts and the value given.
    """

    flip: str = "horizontal"
    scale_range: tuple = (1.0, 1.0)

    def __post_init__(self):
        if self.flip not in FLIPS:
            raise ValueError(f"flip must be one of {', '.join(FLIPS)}, got {self.flip!r}")
        try:
            low, high = (float(v) for v in self.scale_range)
        except (TypeError, ValueError):
            raise ValueError("scale_range must be two numbers (low, high), got "
                             f"{self.scale_range!r}") from None
        if not 0 < low <= high <= 1:        # NaN fails here too
            raise ValueError("scale_range must be (low, high) with 0 < low <= high <= 1 (the "
                             f"factors an image is downscaled by), got ({low:g}, {high:g})")
        object.__setattr__(self, "scale_range", (low, high))

    def scale(self, uniform, height, width, crop):
        """The downscale factor of a sample of a ``height`` x ``width`` image, from ``uniform``
        in [0, 1): log-uniform in ``scale_range``, raised to ``crop / min(height, width)``
        where the scaled image would not hold the crop, and at most 1."""
        low, high = self.scale_range
        drawn = low * (high / low) ** uniform
        return min(1.0, max(drawn, crop / height, crop / width))

    def flip_code(self, horizontal_uniform, vertical_uniform):
        """The sample's flips (HORIZONTAL | VERTICAL bits) from two uniforms in [0, 1)."""
        code = 0
        if self.flip != "none" and horizontal_uniform < 0.5:
            code |= HORIZONTAL
        if self.flip == "both" and vertical_uniform < 0.5:
            code |= VERTICAL
        return code


def scaled_size(height, width, scale):
    """(height, width) of an image of that size downscaled by ``scale`` (rounded)."""
    if scale == 1.0:
        return height, width
    return round(height * scale), round(width * scale)


def pyramid_level(scale):
    """The level k of the image pyramid a crop of ``scale`` (in (0, 1]) is resampled from: the
    largest k with PYRAMID_STEP**k >= scale (so the crop is at most one step further down)."""
    level = int(math.floor(math.log(scale) / math.log(PYRAMID_STEP) + 1e-9))
    return level if PYRAMID_STEP ** level >= scale else level - 1


def resampled_crop(picture, scaled_height, scaled_width, top, left, crop):
    """The ``crop`` x ``crop`` patch at (``top``, ``left``) of ``picture`` resized to
    ``scaled_height`` x ``scaled_width`` (which must hold the patch).

    Returns uint8 (crop, crop, 3): Pillow's Lanczos resize of the whole picture
    to the patch's box, the pixels of resizing the whole picture and cropping
    it. Pillow works outside Python's lock there, so threads resample in
    parallel.
    """
    width, height = picture.size
    if top + crop > scaled_height or left + crop > scaled_width or min(top, left) < 0:
        raise ValueError(f"a {crop}x{crop} crop at ({top}, {left}) is outside the "
                         f"{scaled_height}x{scaled_width} image it is taken from")
    step_y, step_x = height / scaled_height, width / scaled_width
    box = (left * step_x, top * step_y, (left + crop) * step_x, (top + crop) * step_y)
    return np.asarray(picture.resize((crop, crop), Image.LANCZOS, box=box))
