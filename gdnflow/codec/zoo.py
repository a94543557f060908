"""The trained codecs shipped with gdnflow, by architecture and quality::

    from gdnflow.codec import pretrained
    codec = pretrained("hyperprior", quality=2)          # a codec, ready to use
    image_hat = codec.decompress(codec.compress(image))

    gdnflow compress photo.png --quality 3               # no --checkpoint needed
    gdnflow compress photo.png --model factorized_prior --quality 4

:data:`SHIPPED` lists them (CompressAI's qualities and lambdas; ``checkpoints/README.md``
says how they were trained and how they do). The files are installed with
the package (``gdnflow/checkpoints``, from the checkout's top-level
``checkpoints/``) or, in a source checkout, found beside the package; each
is checked against its SHA-256 before use, so a damaged or replaced file is
refused by name instead of coding with other weights.
"""
import dataclasses
import hashlib
from pathlib import Path

from gdnflow.codec.codec import Codec
from gdnflow.codec.format import CodecError

_PACKAGE = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class ShippedModel:
    """One shipped checkpoint: its architecture, quality, lambda, file name and SHA-256."""

    architecture: str
    quality: int
    lmbda: float
    file: str
    sha256: str


#: The architecture ``gdnflow compress`` uses without --model or --checkpoint: the
#: better of the two on held-out photos (checkpoints/README.md).
DEFAULT_SHIPPED_MODEL = "hyperprior"

#: The shipped checkpoints, one :class:`ShippedModel` each.
SHIPPED = (
    ShippedModel("factorized_prior", 1, 0.0018, "codec_q1.h5",
                 "6e6ebb9dd9cbf65fe410939bcce5648abdc5d5c52935bc0ae6ae8a161d90bb33"),
    ShippedModel("factorized_prior", 2, 0.0035, "codec_q2.h5",
                 "72b3082a83578f4961983555c9f6939b2f15a1f062ac3bc1d1cc215c7e353418"),
    ShippedModel("factorized_prior", 3, 0.0067, "codec_q3.h5",
                 "5208f4d0a7d9c27caff74e7a62eb4b29f65c381428db1f0f2f7c5957587ca708"),
    ShippedModel("factorized_prior", 4, 0.013, "codec_q4.h5",
                 "910118b8fadba2a8551f0bd270a07e7dbfc9092158d7f5c1e73ba15dcc06fd44"),
    ShippedModel("hyperprior", 1, 0.0018, "hyperprior_q1.h5",
                 "678b66f094cabfc9d0b833c3e6b4ff853d4232b5bee78158a8e3a687f7cb7f35"),
    ShippedModel("hyperprior", 2, 0.0035, "hyperprior_q2.h5",
                 "4f550ca282ea1c9ae9102567516c995864ff1e648881f6e53a1045419daa062c"),
    ShippedModel("hyperprior", 3, 0.0067, "hyperprior_q3.h5",
                 "ce63526853d09b1729705a0eb39cd1212406c61d017db19ad6b2fbbabb8c9feb"),
    ShippedModel("hyperprior", 4, 0.013, "hyperprior_q4.h5",
                 "c051146b1bfab3c7cdd59ddc7c14b6b912e98c95c09fc35284404910157d1f83"),
)


def shipped_folders():
    """Where the shipped checkpoints are looked for: installed, then beside the package."""
    return [_PACKAGE / "checkpoints", _PACKAGE.parent / "checkpoints"]


def describe_shipped():
    """"factorized_prior quality 1, 2, 3, 4; hyperprior ...": what :data:`SHIPPED` holds,
    for messages."""
    kinds = {}
    for entry in SHIPPED:
        kinds.setdefault(entry.architecture, []).append(str(entry.quality))
    return "; ".join(f"{kind} quality {', '.join(qualities)}" for kind, qualities in kinds.items())


def shipped_checkpoint(architecture=DEFAULT_SHIPPED_MODEL, quality=2, folders=None):
    """The path of the shipped checkpoint of ``architecture`` at ``quality``, its hash checked.

    ``folders``: where to look (default :func:`shipped_folders`). Raises
    CodecError if none is shipped (naming what is), if the file is in none of
    the folders, or if its SHA-256 is not the recorded one.
    """
    folders = shipped_folders() if folders is None else [Path(f) for f in folders]
    entry = next((e for e in SHIPPED if (e.architecture, e.quality) == (architecture, quality)),
                 None)
    if entry is None:
        raise CodecError(f"no shipped {architecture} model of quality {quality}; shipped: "
                         f"{describe_shipped()}")
    path = next((folder / entry.file for folder in folders if (folder / entry.file).is_file()),
                None)
    if path is None:
        raise CodecError(f"the shipped checkpoint {entry.file} is in none of "
                         f"{', '.join(map(str, folders))} (reinstall gdnflow)")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != entry.sha256:
        raise CodecError(f"{path}: not the shipped {entry.file} (SHA-256 {digest[:16]}..., "
                         f"expected {entry.sha256[:16]}...): damaged or replaced; reinstall "
                         "gdnflow")
    return path


def pretrained(architecture=DEFAULT_SHIPPED_MODEL, quality=2, device=None, tile="auto"):
    """The codec of a shipped model (:func:`shipped_checkpoint`), on ``device``."""
    return Codec.from_checkpoint(shipped_checkpoint(architecture, quality), device, tile)
