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

from gdnflow.codec.codec import TILE, Codec
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
                 "15598728656ed0e12d8f32965ff52d292581c575dd7f3eee5ab4b85f8973d318"),
    ShippedModel("factorized_prior", 2, 0.0035, "codec_q2.h5",
                 "a8b21e02672af8f88e2caf1df62805005c01a6a8f3ffbac5411fdd9371579263"),
    ShippedModel("factorized_prior", 3, 0.0067, "codec_q3.h5",
                 "ac1bef604439028d8cfb417f9c17f46d0761414ed76bb94486026b07dafe9920"),
    ShippedModel("factorized_prior", 4, 0.013, "codec_q4.h5",
                 "6a60711da3d203b1a5000817a67aa5535b8b993bea675bf86b06e6a5f7715fd8"),
    ShippedModel("hyperprior", 1, 0.0018, "hyperprior_q1.h5",
                 "52421a3d328e44cb3fa946d40be6116b82db103235947446d2a52afbd7ff66f9"),
    ShippedModel("hyperprior", 2, 0.0035, "hyperprior_q2.h5",
                 "d56fd4f60617909e721857f4ff07ea14fc85b86a5c53816074615c907c8362c2"),
    ShippedModel("hyperprior", 3, 0.0067, "hyperprior_q3.h5",
                 "ca5b0c609cbc41b2d0c4da6f3998e33b9449fce8aa2dded8030e00028f01a376"),
    ShippedModel("hyperprior", 4, 0.013, "hyperprior_q4.h5",
                 "b9603a1e90f016de5c26e07b83e4dcee77fdb7eb508b8810d3d0efcc979766f4"),
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


def pretrained(architecture=DEFAULT_SHIPPED_MODEL, quality=2, device=None, tile=TILE):
    """The codec of a shipped model (:func:`shipped_checkpoint`), on ``device``."""
    return Codec.from_checkpoint(shipped_checkpoint(architecture, quality), device, tile)
