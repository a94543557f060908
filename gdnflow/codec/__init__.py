"""Image codecs from trained factorized-prior and scale-hyperprior autoencoders: real
``.gdn`` files::

    from gdnflow.codec import Codec, pretrained
    codec = pretrained("factorized_prior", quality=2)     # a shipped model (zoo)
    codec = Codec.from_checkpoint("checkpoints/codec_q2.h5")   # or any checkpoint
    data = codec.compress(image)          # uint8 (H, W, 3) -> bytes
    image_hat = codec.decompress(data)    # the model's evaluation-path reconstruction

``tables``: per-channel integer CDFs of the entropy bottleneck, computed
bit-identically on any machine; ``format``: the bitstream (header, range-coded
latents via constriction, escape bits); ``codec``: compress / decompress;
``evaluate`` and ``cli``: ``gdnflow compress``, ``decompress`` and ``eval``;
``hyperprior``, ``gaussian_tables`` and ``hyper_synthesis``: the scale
hyperprior's files (``Codec.from_checkpoint`` returns its codec for such a
checkpoint).
"""
from gdnflow.codec.codec import (Codec, codec_for, compress, decompress, load_model, read_image,
                                 to_uint8)
from gdnflow.codec.format import CodecError, FormatError, ModelMismatchError
# Registers the scale hyperprior's codec with codec_for and Codec.from_checkpoint.
from gdnflow.codec.hyperprior import HyperpriorCodec
from gdnflow.codec.zoo import SHIPPED, pretrained
from gdnflow.codec.tables import CodingTables, build_tables, model_id

__all__ = ["Codec", "codec_for", "pretrained", "SHIPPED", "compress", "decompress", "load_model", "read_image", "to_uint8",
           "HyperpriorCodec", "CodecError", "FormatError", "ModelMismatchError", "CodingTables", "build_tables",
           "model_id"]
