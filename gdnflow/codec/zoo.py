"""The trained codecs shipped with gdnflow, by architecture and quality::

    from gdnflow.codec import pretrained
    codec = pretrained("factorized_prior", quality=2)    # a Codec, ready to use
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
                 "3a129d84fe9a2509c4bdd67001e23b4bc36dc6b18d7c6b3a973ddbded3fef3d3"),
    ShippedModel("factorized_prior", 2, 0.0035, "codec_q2.h5",
                 "4f27dcd1c9c3a357d0765b92d42c81dbdea6e7fc59123ee010fc493c7e4e6906"),
    ShippedModel("factorized_prior", 3, 0.0067, "codec_q3.h5",
                 "aa4cfb0acdb8d62eb0a012e98117c2865b3c0b05f3d3bd7892d6970c5ab2632f"),
    ShippedModel("factorized_prior", 4, 0.013, "codec_q4.h5",
                 "bbddf34156336a06441381302548419c1afce989fd9ba3d4a7307689b1b45362"),
    ShippedModel("hyperprior", 1, 0.0018, "hyperprior_q1.h5",
                 "b18d60213f1085d2ea89aca0a88d05592e4c842267f38077f5b9a6fb2e56ba67"),
    ShippedModel("hyperprior", 2, 0.0035, "hyperprior_q2.h5",
                 "3e604013aa648248f3cff35cbcd97c4c945e640b3e2d03e8dea9d5b88926ba4e"),
    ShippedModel("hyperprior", 3, 0.0067, "hyperprior_q3.h5",
                 "cef7f9651cc6e51d143dcada5a90cd6bdb3ba9680c88264819667c57651e5a34"),
    ShippedModel("hyperprior", 4, 0.013, "hyperprior_q4.h5",
                 "b4f2dd016839ee190f423b662c0116122b2df1d113586bc2f5fbc8af46cce611"),
)


def shipped_folders():
    """Where the shipped checkpoints are looked for: installed, then beside the package."""
    return [_PACKAGE / "checkpoints", _PACKAGE.parent / "checkpoints"]


def describe_shipped():
    """"factorized_prior quality 1, 2, 3": what :data:`SHIPPED` holds, for messages."""
    kinds = {}
    for entry in SHIPPED:
        kinds.setdefault(entry.architecture, []).append(str(entry.quality))
    return "; ".join(f"{kind} quality {', '.join(qualities)}" for kind, qualities in kinds.items())


def shipped_checkpoint(architecture="factorized_prior", quality=2, folders=None):
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


def pretrained(architecture="factorized_prior", quality=2, device=None, tile=TILE):
    """The codec of a shipped model (:func:`shipped_checkpoint`), on ``device``."""
    return Codec.from_checkpoint(shipped_checkpoint(architecture, quality), device, tile)
