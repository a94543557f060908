"""Compress images to ``.gdn`` files with a trained factorized-prior model, and back
(the scale hyperprior's codec, :mod:`gdnflow.codec.hyperprior`, builds on this one).

::

    codec = Codec.from_checkpoint("checkpoints/codec_q2.h5")
    data = codec.compress(image)          # image: uint8 (H, W, 3); data: bytes
    image_hat = codec.decompress(data)    # uint8 (H, W, 3)

Compression: the image (as float32 in [0, 1], exactly as
:func:`gdnflow.data.load_image` reads it) is padded at the bottom and right
to multiples of 16 by reflection (as the trainer's evaluation pads), the
analysis transform g_a gives the latent y, each channel is rounded around
its median, q = round(y - median) (half to even), and q is entropy-coded
with the model's coding tables (:mod:`gdnflow.codec.tables`) into the
bitstream of :mod:`gdnflow.codec.format`.

Both transforms run tile by tile (:mod:`gdnflow.codec.tiling`; ``tile``
pixels a side, :data:`TILE` by default, and on a GPU by default an image of
sides up to :data:`CUDA_WHOLE_SIDE` in one tile): the memory they use beyond the
uint8 image, y or y_hat (float32) and q (int32) does not grow with the
image, and the results equal the untiled ones to float32 rounding (exactly
for an image within one tile: the statements below are about that path).

Decompression decodes q, forms y_hat = q + median in float32 (bit for bit
the y_hat of the model's evaluation path, ``model(x)["y_hat"]``, on any
device: one IEEE rounding and one IEEE addition), runs the synthesis g_s on
the model's device, crops the padding and rounds to 8 bits
(:func:`to_uint8`). The image therefore equals the evaluation path's
``x_hat`` rounded the same way: exactly on the same device, within float
tolerance (at most 1 level where a value straddles .5) on another. (On a
GPU, from the second decode of a one-tile size on, the synthesis is a
replayed inference plan, whose float rounding may differ from the eager
forward's: the same 1-level tolerance. Compression replays plans of the
analysis likewise, bit for bit as the eager one:
:mod:`gdnflow.codec.transform_plans`.) A codec made with ``exact=True`` decodes
through the exact synthesis instead (:mod:`gdnflow.codec.exact_image`): the same bytes
on every device and with any tiles.
"""
import os
from pathlib import Path

import numpy as np

from gdnflow.autograd import no_grad
from gdnflow.backends import cuda
from gdnflow.codec.format import (DOWNSAMPLING, FORMAT_VERSION, MAX_PIXELS, MAX_SIDE, MAX_SYMBOL,
                                  MODEL_ID_BYTES, QUIET_VERSIONS, RANS_VERSION,
                                  SINGLE_STREAM_VERSIONS,
                                  TABLES_DIGEST_BYTES,
                                  WHOLE, CodecError, Header, check_model, pack, unpack)
from gdnflow.codec.substreams import (SUBSTREAM_BITS, check_latents, decode_factorized,
                                      encode_factorized, factorized_split)
from gdnflow.codec.device_latents import dequantized_on_device, quantize_on_device
from gdnflow.codec.device_pixels import DeviceImage, uint8_pixels
from gdnflow.codec.exact_image import ExactImageSynthesis
from gdnflow.codec import host_lanes
from gdnflow.codec.rans_substreams import decode_rans, encode_rans
from gdnflow.codec.tables import build_tables, model_id
from gdnflow.codec.tiling import analysis_crop, reflected_indices, synthesis_crop, tile_ranges
from gdnflow.codec.transform_plans import TransformPlans
from gdnflow.data.images import open_image, read_rgb8
from gdnflow.errors import BackendUnavailableError
from gdnflow.io.checkpoint import CheckpointError, load_checkpoint, read_checkpoint_info
from gdnflow.models import CODEC_MODELS
from gdnflow.sparse.checkpoint import load_pruned
from gdnflow.tensor import Tensor

#: Default tile side in pixels of :class:`Codec` on NumPy (see its ``tile``): measured with
#: benchmarks/codec_memory.py (benchmarks/results/codec_memory_cpu.md).
TILE = 512
#: On a GPU (``tile="auto"``), an image whose padded sides are at most this many pixels is
#: one tile: fewer launches and no halo, 2x faster at 2048x1536 than tiles of TILE
#: (benchmarks/results/codec_speed_h200.md), about 3 GB of device memory for 2048x2048
#: with the 128-channel models; larger images run in tiles of TILE, which keeps a
#: 50-megapixel photo under 2 GB (benchmarks/results/codec_memory_gpu.md).
CUDA_WHOLE_SIDE = 2048


def check_image(image):
    """``image`` as a uint8 (H, W, 3) array; ValueError unless it is one the format can store."""
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"expected an RGB image as uint8 of shape (H, W, 3), got "
                         f"{image.dtype} {image.shape}")
    height, width = image.shape[:2]
    if not height or not width:
        raise ValueError(f"the image is empty ({height}x{width})")
    if max(height, width) > MAX_SIDE or height * width > MAX_PIXELS:
        raise ValueError(f"the image is {height}x{width}: the format stores sides up to "
                         f"{MAX_SIDE} pixels and up to {MAX_PIXELS} pixels in all")
    return image


def image_to_array(image):
    """uint8 (H, W, 3) as float32 (3, H, W) in [0, 1]: what load_image gives for 8-bit files."""
    image = check_image(image)
    return np.ascontiguousarray(image.transpose(2, 0, 1), dtype=np.float32) / np.float32(255)


def to_uint8(x):
    """Pixels (3, H, W) in [0, 1] as uint8 (H, W, 3): round(255 clip(x, 0, 1)), halves up."""
    x = np.clip(np.asarray(x, np.float32), 0, 1) * np.float32(255) + np.float32(0.5)
    return np.ascontiguousarray(np.floor(x).astype(np.uint8).transpose(1, 2, 0))


def read_image(path, max_pixels=None):
    """The image file at ``path`` as uint8 (H, W, 3) RGB (grey, palette, alpha converted).

    The pixels :func:`gdnflow.data.load_image` reads (times 255), without a
    float copy; ``max_pixels`` as there. An image the format cannot store
    is refused from its header, naming the file.
    """
    with open_image(path, max_pixels) as image:
        width, height = image.size
    if max(height, width) > MAX_SIDE or height * width > MAX_PIXELS:
        raise CodecError(f"{path}: {width}x{height} pixels: the .gdn format stores images of up "
                         f"to {MAX_PIXELS} pixels and {MAX_SIDE} a side (cut it into parts)")
    return read_rgb8(path, max_pixels)


#: Where a codec's rANS lanes may be coded (Codec's ``lanes``).
LANE_DEVICES = ("host", "cuda", "numpy")


def lane_device(device, lanes, name):
    """Where the rANS lanes of a codec on ``device`` are coded: ``lanes`` checked, or the
    default for None (Codec's docstring); ``name`` (the codec's class) leads the errors."""
    if lanes is None:
        return "host" if device == "cuda" and host_lanes.available() else device
    if lanes not in LANE_DEVICES:
        raise ValueError(f"{name}: lanes must be one of {LANE_DEVICES} or None, got {lanes!r}")
    if lanes == "cuda" and device != "cuda":
        raise ValueError(f"{name}: lanes=\"cuda\" needs a model on the cuda device, this one "
                         f"is on {device}")
    if lanes == "host" and not host_lanes.available():
        raise BackendUnavailableError(f"{name}: lanes=\"host\" needs nvcc to build the lane "
                                      "coder for the host (cuda_src/rans.cu); none works here")
    return lanes


def model_device(model):
    """The device of the model's parameters."""
    for p in model.parameters():
        return p.device
    raise ValueError("the model has no parameters")


class Codec:
    """A factorized-prior model with its coding tables: compress and decompress images.

    ``Codec(model, tile="auto")`` puts the model in eval mode and builds its
    tables (a few milliseconds; rebuild the Codec after changing the
    weights). A scale hyperprior's codec is a
    :class:`~gdnflow.codec.hyperprior.HyperpriorCodec`: :func:`codec_for` and
    :meth:`from_checkpoint` choose the class (TypeError for the wrong one).
    Images are uint8 (H, W, 3) arrays of any size >= 1x1 up to
    :data:`~gdnflow.codec.format.MAX_PIXELS`. The transforms run on tiles
    of ``tile`` x ``tile`` pixels (a multiple of the model's padding, 16 or
    64; None: the whole image at once; "auto": :data:`TILE`, and on a GPU
    the whole image where its sides are at most :data:`CUDA_WHOLE_SIDE`) with
    the halo their receptive field needs (:mod:`gdnflow.codec.tiling`):
    memory beyond the image and its latents
    is bounded by the tile, whatever the image size, and the result equals
    the untiled one to float32 rounding. ``version``: the format version
    written, one of :attr:`versions` (by default :meth:`default_version`: on a
    GPU the last, rANS substreams that the host's threads code (``lanes``);
    elsewhere the one before, range-coded substreams leaving out the quiet
    channels; the second, every
    channel coded, is what gdnflow before quiet channels reads; the first, one
    stream, what gdnflow before substreams reads); every readable version is
    read. ``executor``: a
    :class:`concurrent.futures.Executor` whose ``map`` codes the range-coded
    substreams (None: one after another; constriction holds the GIL, so threads
    gain nothing: :mod:`gdnflow.codec.substreams`); the rANS lanes (versions 14
    and 16) are coded all at once where ``lanes`` says, without it.
    ``substream_bits``: the estimated payload bits per substream the encoder
    aims for (smaller: more substreams to code in parallel, about 5 bytes each;
    None: the class's :meth:`default_substream_bits`).
    ``lanes``: where rANS lanes (versions 14 and 16) are coded: ``"host"``
    (rans.cu's lane coder built for the host, the lanes shared among threads:
    :mod:`gdnflow.codec.host_lanes`), ``"cuda"`` (one GPU thread a lane) or
    ``"numpy"``; None: ``"host"`` on a GPU codec where that build can be made
    (nvcc), else the codec's device.
    ``exact``: decode through :class:`~gdnflow.codec.exact_image.ExactImageSynthesis`:
    the same bytes on NumPy and on a GPU, whatever the tiles, within a level of the
    float32 synthesis's (2.3-2.8x slower on NumPy; on a GPU see docs/codecs.md); False
    (the default): the float32 synthesis, whose pixels differ by a level here and there
    between devices. Compression is the same either way.
    Attributes: ``model``, ``tables`` (:class:`~gdnflow.codec.tables.CodingTables`),
    ``device``, ``tile``, ``version``, ``substream_bits``, ``lanes``, ``exact_synthesis``
    (the ExactImageSynthesis, or None). A GPU codec keeps inference plans of its
    transforms for the sizes it has seen twice (:mod:`gdnflow.codec.transform_plans`:
    about 0.5 GiB per size at 768x512; an exact one a CUDA graph of its exact synthesis
    for one size, 0.71 GiB at 768x512; :meth:`close` releases them), and their buffers
    are shared by its calls: use one codec per thread.
    """

    #: The format versions this class writes (:mod:`gdnflow.codec.format`).
    versions = (2, 7, FORMAT_VERSION, RANS_VERSION)

    def __init__(self, model, tile="auto", version=None, executor=None,
                 substream_bits=None, lanes=None, exact=False):
        wanted = CODECS.get(getattr(model, "name", None), Codec)
        if type(self) is not wanted:
            raise TypeError(f"{type(self).__name__}: a {type(model).__name__} model is coded by "
                            f"{wanted.__name__} (codec_for(model) chooses it)")
        #: Images are padded to multiples of this (16; 64 for the scale hyperprior).
        self.multiple = getattr(model, "downsampling", DOWNSAMPLING)
        self.device = model_device(model)
        #: Padded image sides up to which the image is one tile (0: never; see tile_pixels).
        self.whole_side = 0
        if isinstance(tile, str) and tile == "auto":
            tile, self.whole_side = TILE, CUDA_WHOLE_SIDE if self.device == "cuda" else 0
        if tile is not None and (isinstance(tile, str) or int(tile) != tile or tile < self.multiple
                                 or tile % self.multiple):
            raise ValueError(f"{type(self).__name__}: tile must be a positive multiple of "
                             f"{self.multiple} pixels, \"auto\" or None, got {tile!r}")
        self.model = model.eval()
        self.tables = self.build_tables(model)
        self.tile = tile
        self.lanes = lane_device(self.device, lanes, type(self).__name__)
        self.version = self.default_version() if version is None else version
        if self.version not in self.versions:
            raise ValueError(f"{type(self).__name__}: writes format versions "
                             f"{self.versions}, got {version!r}")
        #: Runs the substreams' coding: the builtin map, or the executor's.
        self.map = map if executor is None else executor.map
        if substream_bits is None:
            substream_bits = self.default_substream_bits()
        elif not substream_bits > 0:      # also NaN
            raise ValueError(f"{type(self).__name__}: substream_bits must be a positive number "
                             f"of bits, got {substream_bits!r}")
        self.substream_bits = substream_bits
        #: Runs the model's transforms on one-tile images of a GPU codec, as replayed
        #: inference plans where it can.
        self._plans = TransformPlans(self.model)
        self.exact_synthesis = ExactImageSynthesis(self.model.g_s) if exact else None
        self._id = self.tables.model_id[:MODEL_ID_BYTES]
        self._digest = self.tables.digest()[:TABLES_DIGEST_BYTES]

    def default_version(self):
        """The version written when none is asked for: the rANS substreams where their lanes
        are coded on the host's threads or a GPU (:mod:`gdnflow.codec.host_lanes`,
        :mod:`gdnflow.codec.rans`), else the range-coded ones (constriction codes them faster
        than NumPy's rANS lanes)."""
        return RANS_VERSION if self.lanes != "numpy" else FORMAT_VERSION

    def default_substream_bits(self):
        """The payload bits per substream aimed for when none are asked for:
        :data:`~gdnflow.codec.substreams.SUBSTREAM_BITS`."""
        return SUBSTREAM_BITS

    @staticmethod
    def build_tables(model):
        """The coding tables of ``model`` (:func:`~gdnflow.codec.tables.build_tables`)."""
        return build_tables(model)

    @classmethod
    def from_checkpoint(cls, path, device=None, tile="auto", exact=False):
        """The codec of the model in the checkpoint at ``path`` (see :func:`load_model`):
        a :class:`Codec`, or a :class:`~gdnflow.codec.hyperprior.HyperpriorCodec` for a
        scale-hyperprior checkpoint; ``exact``: decode with the exact synthesis."""
        return codec_for(load_model(path, device), tile, exact)

    def tile_pixels(self, height, width):
        """The tile side in pixels for a padded image of height x width: ``tile``, or None
        (the whole image at once) if ``tile`` is or if both sides are within ``whole_side``."""
        return None if max(height, width) <= self.whole_side else self.tile

    def _latent_tiles(self, latent_height, latent_width):
        """[(row range, column range)] of the latent tiles, row-major."""
        tile = self.tile_pixels(latent_height * DOWNSAMPLING, latent_width * DOWNSAMPLING)
        side = None if tile is None else tile // DOWNSAMPLING
        return [(rows, columns) for rows in tile_ranges(latent_height, side)
                for columns in tile_ranges(latent_width, side)]

    # --------------------------------------------------------- encode --
    def _unit_tile(self, image, whole, rows, columns):
        """float32 (1, 3, len(rows), len(columns)) on the model's device: the uint8 image's
        pixels at rows x columns over 255 (``whole``: the image already on the GPU, or None)."""
        if whole is not None:
            return whole.tile(rows, columns)
        pixels = image[np.ix_(rows, columns)]
        if self.device == "cuda":
            return DeviceImage(pixels).tile(np.arange(len(rows)), np.arange(len(columns)))
        return Tensor(np.ascontiguousarray(pixels.transpose(2, 0, 1), np.float32)[None]
                      / np.float32(255), device=self.device)

    def _analysis_layout(self, image):
        """(padded sides, source rows, source columns, y's shape, y's tiles) of a uint8 image."""
        height, width = image.shape[:2]
        m = self.multiple
        padded = (-(-height // m) * m, -(-width // m) * m)
        rows, columns = reflected_indices(height, padded[0]), reflected_indices(width, padded[1])
        shape = (self.tables.channels, padded[0] // DOWNSAMPLING, padded[1] // DOWNSAMPLING)
        return padded, rows, columns, shape, self._latent_tiles(*shape[1:])

    def analyse(self, image):
        """The latent y (M, H'/16, W'/16) float32 of a uint8 image reflection-padded to H' x W',
        the multiples of ``multiple``.

        Tile by tile: each tile's pixels are gathered from the uint8 image
        (the reflection padding by index) and converted to float32 on their own
        (on a GPU codec, on the device: :mod:`gdnflow.codec.device_pixels`).
        """
        image = check_image(image)
        padded, rows, columns, shape, tiles = self._analysis_layout(image)
        g_a = self.model.g_a
        y = np.empty(shape, np.float32)
        # On a GPU the pixels are converted there (the same values): the whole uint8 image
        # goes up once for one tile; for many (a large image) each tile's crop, so that the
        # device holds no more than a tile's worth (benchmarks/results/codec_memory_gpu.md).
        whole = DeviceImage(image) if self.device == "cuda" and len(tiles) == 1 else None
        for (top, bottom), (left, right) in tiles:
            r0, r1 = analysis_crop(g_a, top, bottom, padded[0])
            c0, c1 = analysis_crop(g_a, left, right, padded[1])
            x = self._unit_tile(image, whole, rows[r0:r1], columns[c0:c1])
            with no_grad():
                latents = g_a(x).numpy()[0]
            r0, c0 = r0 // DOWNSAMPLING, c0 // DOWNSAMPLING
            y[:, top:bottom, left:right] = latents[:, top - r0:bottom - r0, left - c0:right - c0]
        return y

    def analyse_on_device(self, image):
        """y (1, M, H'/16, W'/16) as a cuda Tensor, for a GPU codec whose image is one tile
        (what :meth:`analyse` computes, left on the device); None otherwise. From the
        second image of a size on, y is an inference plan's buffer
        (:mod:`~gdnflow.codec.transform_plans`), which the next analysis of that size
        overwrites."""
        image = check_image(image)
        padded, rows, columns, shape, tiles = self._analysis_layout(image)
        if self.device != "cuda" or len(tiles) != 1:
            return None
        with no_grad():
            y = self._plans("g_a", DeviceImage(image).tile(rows, columns),
                            padded[0] * padded[1])
        if y.shape[1:] != shape:
            raise CodecError(f"{type(self).__name__}: the analysis made latents of "
                             f"{y.shape[1:]} for a {padded[0]}x{padded[1]} image, expected "
                             f"{shape}")
        return y

    def quantize(self, y):
        """q = round(y - median) per channel, half to even, as int32 (the eval path's rounding)."""
        return quantize_latents(y, self.tables.medians)

    def encode_latents(self, q, height, width):
        """The file bytes for integer latents ``q`` (M, h, w) of an image of height x width."""
        q = check_latents(q, self.tables.channels)
        single = self.version in SINGLE_STREAM_VERSIONS
        split = WHOLE if single else factorized_split(q, self.tables, self.substream_bits)
        header = Header(height, width, q.shape[0], q.shape[1], q.shape[2], self._id,
                        self._digest, self.version, splits=() if single else (split,))
        if self.version == RANS_VERSION:
            return pack(header, encode_rans(q, self.tables, split, True, self.lanes))
        return pack(header, encode_factorized(q, self.tables, split, self.map,
                                              self.version in QUIET_VERSIONS))

    def compress(self, image):
        """The ``.gdn`` bytes of a uint8 (H, W, 3) image (on a GPU, an image of one tile is
        quantised on the device: :mod:`gdnflow.codec.device_latents`)."""
        image = check_image(image)
        y = self.analyse_on_device(image)
        q = self.quantize(self.analyse(image)) if y is None else \
            quantize_on_device(y, self.tables.medians)
        return self.encode_latents(q, image.shape[0], image.shape[1])

    # --------------------------------------------------------- decode --
    def decode_quantized(self, data, source="<bytes>", on_device=False):
        """(Header, q int32 (M, h, w)): the integer latents of a file's bytes; errors name
        ``source``. ``on_device``: q may be a device array where a GPU codec decoded it
        there (version 14)."""
        header, substreams = unpack(data, source)
        check_model(header, self.tables, source, self._digest)
        split = header.splits[0] if header.splits else WHOLE
        if header.version == RANS_VERSION:
            return header, decode_rans(substreams, self.tables, split, header.latent_shape,
                                       source, True, self.lanes, on_device)
        return header, decode_factorized(substreams, self.tables, split, header.latent_shape,
                                         source, self.map, header.version in QUIET_VERSIONS)

    def decode_latents(self, data, source="<bytes>"):
        """(Header, y_hat float32 (M, h, w)) of a file's bytes; errors name ``source``."""
        header, q = self.decode_quantized(data, source)
        return header, dequantize_latents(q, self.tables.medians)

    def _synthesis_tiles(self, height, width, latent_shape):
        """[(tile's latent rows, columns, the latent rows and columns it reads)] of the
        synthesis of a height x width image from latents of ``latent_shape`` (M, h, w)."""
        g_s = self.model.g_s
        needed = (-(-height // DOWNSAMPLING), -(-width // DOWNSAMPLING))
        return [((top, bottom), (left, right),
                 synthesis_crop(g_s, top * DOWNSAMPLING, bottom * DOWNSAMPLING, latent_shape[1]),
                 synthesis_crop(g_s, left * DOWNSAMPLING, right * DOWNSAMPLING, latent_shape[2]))
                for (top, bottom), (left, right) in self._latent_tiles(*needed)]

    def dequantize_on_device(self, q, height, width):
        """y_hat (1, M, h, w) as a cuda Tensor (:mod:`gdnflow.codec.device_latents`) where a
        GPU codec synthesises the height x width image as one tile reading all of q (a host
        or device array); else None."""
        if self.device != "cuda" or not reads_all(self._synthesis_tiles(height, width, q.shape),
                                                  q.shape):
            return None
        return dequantized_on_device(q, self.tables.medians)

    def synthesise(self, y_hat, height, width):
        """The uint8 (height, width, 3) image the synthesis transform makes of y_hat (M, h, w),
        or of the cuda Tensor that :meth:`dequantize_on_device` makes.

        Tile by tile: each tile's latents with the halo it reads, its pixels
        rounded to uint8 into the output (on a GPU codec, on the device).
        """
        on_device = isinstance(y_hat, Tensor)
        if on_device and (y_hat.device != "cuda" or len(y_hat.shape) != 4):
            raise ValueError(f"{type(self).__name__}.synthesise: y_hat must be an (M, h, w) "
                             f"array or a (1, M, h, w) cuda Tensor, got a {y_hat.device} Tensor "
                             f"of {y_hat.shape}")
        if not on_device:
            y_hat = np.asarray(y_hat, np.float32)
        shape = y_hat.shape[1:] if on_device else y_hat.shape
        tiles = self._synthesis_tiles(height, width, shape)
        if on_device and not reads_all(tiles, shape):
            raise ValueError(f"{type(self).__name__}.synthesise: a device y_hat of {shape} is "
                             f"not one tile's whole input for a {height}x{width} image")
        image = np.empty((height, width, 3), np.uint8)
        for (top, bottom), (left, right), (r0, r1), (c0, c1) in tiles:
            rows = slice(top * DOWNSAMPLING, min(bottom * DOWNSAMPLING, height))
            columns = slice(left * DOWNSAMPLING, min(right * DOWNSAMPLING, width))
            if self.exact_synthesis is not None:
                pixels = self.exact_synthesis.tile_pixels(
                    y_hat if on_device else y_hat[:, r0:r1, c0:c1], self.device, len(tiles) == 1)
                image[rows, columns] = pixels[
                    rows.start - r0 * DOWNSAMPLING:rows.stop - r0 * DOWNSAMPLING,
                    columns.start - c0 * DOWNSAMPLING:columns.stop - c0 * DOWNSAMPLING]
                continue
            latents = y_hat if on_device else Tensor(
                np.ascontiguousarray(y_hat[None, :, r0:r1, c0:c1]), device=self.device)
            with no_grad():
                pixels = self._synthesis(latents, on_device)
            r0, c0 = r0 * DOWNSAMPLING, c0 * DOWNSAMPLING
            if self.device == "cuda" and pixels.dtype == np.float32:   # rounded on the device
                image[rows, columns] = uint8_pixels(pixels, rows.start - r0, columns.start - c0,
                                                    rows.stop - rows.start,
                                                    columns.stop - columns.start)
            else:
                image[rows, columns] = to_uint8(pixels.numpy()[0][
                    :, rows.start - r0:rows.stop - r0, columns.start - c0:columns.stop - c0])
        return image

    def _synthesis(self, latents, whole):
        """g_s of ``latents`` (1, M, h, w): through the transforms' plans where they are a
        ``whole`` image's device latents, else eagerly."""
        if not whole:
            return self.model.g_s(latents)
        return self._plans("g_s", latents, latents.shape[2] * latents.shape[3]
                           * DOWNSAMPLING ** 2)

    def close(self):
        """Release the GPU buffers the codec keeps between calls (its transforms' plans, its
        exact synthesis's CUDA graph); they are made again when needed."""
        self._plans.close()
        if self.exact_synthesis is not None:
            self.exact_synthesis.replays.close()

    def decompress(self, data, source="<bytes>"):
        """The uint8 (H, W, 3) image of a ``.gdn`` file's bytes; errors name ``source`` (on a
        GPU, y_hat of an image of one tile is made on the device)."""
        header, q = self.decode_quantized(data, source, on_device=self.device == "cuda")
        y_hat = self.dequantize_on_device(q, header.height, header.width)
        if y_hat is None:
            if not isinstance(q, np.ndarray):
                q = cuda.get_runtime().to_numpy(q)
            y_hat = dequantize_latents(q, self.tables.medians)
        del q       # y_hat holds what the synthesis needs: let the latents go first
        return self.synthesise(y_hat, header.height, header.width)


def reads_all(tiles, shape):
    """Whether ``tiles`` (:meth:`Codec._synthesis_tiles`) are one tile reading every latent
    row and column of ``shape`` (M, h, w): then the synthesis can take y_hat as it is."""
    return len(tiles) == 1 and (tiles[0][2], tiles[0][3]) == ((0, shape[1]), (0, shape[2]))


#: Elements per step of the codec's per-channel loops: a few channels at a time bound the
#: temporaries (16 MB) without a Python step per channel.
CHANNEL_CHUNK_ELEMENTS = 1 << 22


def channel_chunks(shape):
    """Slices of the leading axis of a (C, h, w) array, each about CHANNEL_CHUNK_ELEMENTS."""
    step = max(1, CHANNEL_CHUNK_ELEMENTS // max(1, int(np.prod(shape[1:]))))
    return [slice(c, min(c + step, shape[0])) for c in range(0, shape[0], step)]


def dequantize_latents(q, medians):
    """y_hat float32 = q + medians[c] per channel c of integer latents q (C, h, w)."""
    y_hat = np.empty(q.shape, np.float32)
    medians = np.asarray(medians, np.float32)[:, None, None]
    for chunk in channel_chunks(q.shape):
        y_hat[chunk] = q[chunk].astype(np.float32) + medians[chunk]
    return y_hat


def quantize_latents(y, medians):
    """q = round(y[c] - medians[c]) per channel c, half to even, as int32.

    Raises CodecError if a value is not finite or beyond +-MAX_SYMBOL (a
    diverged model).
    """
    y = np.asarray(y, np.float32)
    medians = np.asarray(medians, np.float32)[:, None, None]
    q = np.empty(y.shape, np.int32)
    for chunk in channel_chunks(y.shape):     # a few channels' temporaries at a time
        values = np.rint(y[chunk] - medians[chunk])
        if not np.all(np.abs(values) < MAX_SYMBOL):      # also catches NaN and infinity
            raise CodecError(f"latent values beyond +-{MAX_SYMBOL} or not finite (a "
                             "diverged model?): nothing to code")
        q[chunk] = values
    return q


#: The codec class of each model kind, by the model's ``name``: Codec here, and the
#: scale hyperprior's (gdnflow.codec.hyperprior, which builds on this module) adds its own.
CODECS = {}


def codec_for(model, tile="auto", exact=False):
    """The codec of ``model``: a :class:`Codec` (factorized prior) or a HyperpriorCodec
    (``exact``: decoding with the exact synthesis)."""
    return CODECS.get(getattr(model, "name", None), Codec)(model, tile, exact=exact)


def compress(model, image):
    """The ``.gdn`` bytes of a uint8 (H, W, 3) image under ``model`` (see :class:`Codec`)."""
    return codec_for(model).compress(image)


def decompress(model, data, source="<bytes>"):
    """The uint8 (H, W, 3) image coded in ``data`` (bytes) by ``model`` (see :class:`Codec`)."""
    return codec_for(model).decompress(data, source)


# ----------------------------------------------------------- checkpoints --
def load_model(path, device=None):
    """The codec model (factorized prior or scale hyperprior) in the checkpoint at ``path``,
    in eval mode.

    Raises CodecError naming the file if it is missing, unreadable or holds
    another kind of model.
    """
    path = os.fspath(path)
    try:
        info = read_checkpoint_info(path)
    except FileNotFoundError:
        raise CodecError(f"no checkpoint at {path}") from None
    except CheckpointError as exc:
        raise CodecError(str(exc)) from None
    config = info["config"]
    kind = CODEC_MODELS.get(info["model_name"])
    if kind is None or "N" not in config or "M" not in config:
        raise CodecError(f"{path}: holds a {info['model_name']!r} model, not a codec model "
                         f"({' or '.join(sorted(CODEC_MODELS))}: train one with gdnflow train)")
    model = kind(config["N"], config["M"], seed=0, device=device)
    try:
        load_pruned(path, model)        # a pruned checkpoint (gdnflow prune) too
    except CheckpointError as exc:
        raise CodecError(str(exc)) from None
    return model.eval()


def checkpoint_id(path):
    """:func:`~gdnflow.codec.tables.model_id` of a checkpoint file's weights (no model built):
    as a model holds them once loaded (float16-stored weights as their float32 values)."""
    saved = load_checkpoint(path)
    return model_id({**saved["parameters"], **saved["buffers"]})


def read_header(data, source="<bytes>"):
    """The :class:`~gdnflow.codec.format.Header` of a file's bytes (checked as by ``unpack``)."""
    return unpack(data, source)[0]


def find_checkpoint(header, folders):
    """The first ``*.h5`` checkpoint in ``folders`` whose model id is the header's, or None.

    Folders are searched in order, files in sorted order; unreadable files
    and missing folders are skipped.
    """
    for folder in folders:
        folder = Path(folder)
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.h5")):
            try:
                if checkpoint_id(path)[:MODEL_ID_BYTES] == header.model_id:
                    return path
            except Exception:       # noqa: BLE001 (not a checkpoint: not the one sought)
                continue
    return None
