"""Build the training corpus and its held-out photos from openly licensed Debian and PyPI packages.

    python checkpoints/build_corpus.py OUT --packages DEBS --download  # fetch, then build
    python checkpoints/build_corpus.py OUT --packages DEBS             # .deb files in DEBS

Every photograph is listed in ``checkpoints/corpus_manifest.json``: its source
(a Debian package at a version, or a PyPI package), its path there, its
licence as the package's copyright file states it, its author, its pixel size,
the SHA-256 of its bytes and whether it is held out. The script

1. finds each Debian package unpacked in ``DEBS/<package>/``, or unpacks
   ``DEBS/<package>_<version>_*.deb`` there (``dpkg-deb -x``; ``--download``
   first fetches the missing ones with ``apt-get download package=version``,
   no root needed); PyPI packages are read where Python finds them installed
   (scikit-image comes with ``pip install 'gdnflow[data]'``);
2. reads every listed file (an image inside an Enlightenment ``.edj`` theme
   file is the JPEG stored as its ``member``) and checks its SHA-256, before
   writing anything: a file that differs stops the build, naming it;
3. writes ``OUT/train/NAME.jpg|png`` (the files' own bytes, never re-encoded),
   ``OUT/heldout/NAME.png`` (held-out photos in RGB, scaled with Lanczos to
   768 pixels on the long side when larger, as Kodak's 768x512 are; never in
   train), ``OUT/SOURCES.md`` (every source, version, image, author and
   licence) and ``OUT/licences/`` (each package's copyright file).

Nothing of the photos is in the repository; this script and the manifest are.
"""
import argparse
import hashlib
import importlib.util
import io
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

from PIL import Image

MANIFEST = Path(__file__).with_name("corpus_manifest.json")
#: The fields every image of the manifest has (``member`` and ``note`` may be added).
IMAGE_FIELDS = ("name", "source", "path", "licence", "author", "sha256", "width", "height",
                "held_out")
#: First word of an Eet file (Enlightenment's archive format, of its ``.edj`` themes).
EET_MAGIC = 0x1EE70F42


class CorpusError(Exception):
    """The manifest, a package or a file is not what the corpus needs; the message says which."""


# ------------------------------------------------------------------ manifest --
def load_manifest(path=MANIFEST):
    """The manifest at ``path`` as a dict, checked by :func:`check_manifest`."""
    manifest = json.loads(Path(path).read_text())
    check_manifest(manifest)
    return manifest


def check_manifest(manifest):
    """Raise CorpusError naming the first inconsistency of ``manifest``.

    Every image names a listed source, has every field of IMAGE_FIELDS, a
    licence, a 64-digit SHA-256 and a boolean ``held_out``; names, files
    and contents are unique (so no photo is both trained on and held out);
    every source is used.
    """
    sources, images = manifest.get("sources", {}), manifest.get("images", [])
    seen = {"name": {}, "file": {}, "sha256": {}}
    for number, image in enumerate(images):
        label = image.get("name", f"image {number}")
        missing = [field for field in IMAGE_FIELDS if field not in image]
        if missing:
            raise CorpusError(f"manifest: {label} lacks {', '.join(missing)}")
        if image["source"] not in sources:
            raise CorpusError(f"manifest: {label} names the source {image['source']!r}, which is "
                              "not among its sources")
        if not str(image["licence"]).strip():
            raise CorpusError(f"manifest: {label} has no licence")
        digest = str(image["sha256"])
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise CorpusError(f"manifest: {label}: sha256 must be 64 lower-case hex digits, got "
                              f"{digest!r}")
        if not isinstance(image["held_out"], bool):
            raise CorpusError(f"manifest: {label}: held_out must be true or false, got "
                              f"{image['held_out']!r}")
        keys = {"name": label, "file": (image["source"], image["path"], image.get("member")),
                "sha256": digest}
        for kind, key in keys.items():
            if key in seen[kind]:
                raise CorpusError(f"manifest: {label} and {seen[kind][key]} have the same {kind}")
            seen[kind][key] = label
    unused = set(sources) - {image["source"] for image in images}
    if unused:
        raise CorpusError(f"manifest: sources no image uses: {', '.join(sorted(unused))}")


# ------------------------------------------------------------------- sources --
def package_roots(manifest, packages, download=False):
    """{source name: the folder its paths are relative to}; unpacks and downloads as needed."""
    roots = {}
    for name, source in manifest["sources"].items():
        if source["kind"] == "pypi":
            spec = importlib.util.find_spec(source["module"])
            if spec is None or not spec.submodule_search_locations:
                raise CorpusError(f"the PyPI package {name} is not installed (its module "
                                  f"{source['module']} is not found): pip install {name}")
            roots[name] = Path(list(spec.submodule_search_locations)[0])
        elif source["kind"] == "deb":
            roots[name] = debian_tree(name, source["version"], Path(packages), download)
        else:
            raise CorpusError(f"manifest: source {name} has the unknown kind {source['kind']!r}")
    return roots


def debian_tree(package, version, packages, download):
    """``packages/<package>``, unpacked from its .deb there (fetched first if ``download``)."""
    tree = packages / package
    if tree.is_dir():
        return tree
    file_version = version.replace(":", "%3a")        # how apt-get names an epoch in a file
    debs = sorted(packages.glob(f"{package}_{file_version}_*.deb"))
    if not debs and download:
        packages.mkdir(parents=True, exist_ok=True)
        subprocess.run(["apt-get", "download", f"{package}={version}"], cwd=packages, check=True)
        debs = sorted(packages.glob(f"{package}_{file_version}_*.deb"))
    if not debs:
        raise CorpusError(f"{package} {version} is neither unpacked in {tree} nor a .deb in "
                          f"{packages}: pass --download, or run apt-get download "
                          f"{package}={version} in {packages}")
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(tree)], check=True)
    return tree


def eet_member(data, member, path):
    """The bytes of entry ``member`` of the Eet archive ``data`` (read from ``path``).

    An Eet file (version 2) starts with big-endian 32-bit words: the magic, the
    number of entries and of dictionary words, then per entry its offset, size,
    unpacked size, name offset, name size (with its NUL) and flags. Images
    stored lossy are plain JPEG files in entries of flags 0.
    """
    def fail(what):
        return CorpusError(f"{path}: {what}")
    if len(data) < 12 or struct.unpack(">I", data[:4])[0] != EET_MAGIC:
        raise fail("not an Eet (version 2) file")
    count = struct.unpack(">I", data[4:8])[0]
    for number in range(count):
        start = 12 + 24 * number
        offset, size, unpacked, name_at, name_size, flags = struct.unpack(
            ">6i", data[start:start + 24])
        if data[name_at:name_at + name_size].rstrip(b"\0").decode("utf-8", "replace") != member:
            continue
        if flags != 0 or size != unpacked:
            raise fail(f"entry {member} is compressed or ciphered (flags {flags}): not read here")
        return data[offset:offset + size]
    raise fail(f"no entry {member} among its {count} entries")


def read_image_bytes(image, roots):
    """The bytes of manifest ``image`` (its file, or its member of an Eet file)."""
    path = roots[image["source"]] / image["path"]
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CorpusError(f"{image['name']}: cannot read {path} ({exc.strerror}): is "
                          f"{image['source']} the version the manifest lists?") from None
    return eet_member(data, image["member"], path) if image.get("member") else data


def verified(manifest, roots):
    """[(image, bytes)] of every image, each checked against its SHA-256 (CorpusError if not)."""
    out = []
    for image in manifest["images"]:
        data = read_image_bytes(image, roots)
        digest = hashlib.sha256(data).hexdigest()
        if digest != image["sha256"]:
            where = roots[image["source"]] / image["path"]
            member = f" (entry {image['member']})" if image.get("member") else ""
            raise CorpusError(f"{image['name']}: {where}{member} has SHA-256 {digest}, the "
                              f"manifest expects {image['sha256']}: not the file the corpus "
                              f"lists (another version of {image['source']}?)")
        out.append((image, data))
    return out


# -------------------------------------------------------------------- output --
def held_out_png(data, long_side):
    """PNG bytes of the image ``data`` in RGB, scaled (Lanczos) to ``long_side`` if larger."""
    with Image.open(io.BytesIO(data)) as opened:
        image = opened.convert("RGB")
    factor = long_side / max(image.size)
    if factor < 1:
        size = (round(image.width * factor), round(image.height * factor))
        image = image.resize(size, Image.LANCZOS)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue(), image.size


def train_file_name(image):
    """``NAME.jpg`` or ``NAME.png``: the name with the suffix of what the bytes are."""
    suffix = ".jpg" if image.get("member") else Path(image["path"]).suffix.lower()
    return image["name"] + (".jpg" if suffix == ".jpeg" else suffix)


def sources_text(manifest, written):
    """SOURCES.md: the sources with their licences and megapixels, then every image."""
    lines = ["# Sources of this corpus", "",
             "Built by gdnflow's checkpoints/build_corpus.py from "
             "checkpoints/corpus_manifest.json. "
             "Licences as each package's copyright file states them (copies in licences/); "
             "a note gives what the image's own metadata says where it differs.", "",
             "| source | version | images (held out) | megapixels | licences |",
             "|---|---|---:|---:|---|"]
    for name, source in manifest["sources"].items():
        images = [i for i in manifest["images"] if i["source"] == name]
        megapixels = sum(i["width"] * i["height"] for i in images) / 1e6
        held = sum(i["held_out"] for i in images)
        licences = ", ".join(sorted({i["licence"] for i in images}))
        kind = "Debian" if source["kind"] == "deb" else "PyPI"
        lines.append(f"| {name} ({kind}) | {source['version']} | {len(images)} ({held}) | "
                     f"{megapixels:.1f} | {licences} |")
    lines += ["", "| file | split | source path | size | licence | author | note |",
              "|---|---|---|---|---|---|---|"]
    for image in manifest["images"]:
        member = f" ({image['member']})" if image.get("member") else ""
        lines.append(f"| {written[image['name']]} | {'heldout' if image['held_out'] else 'train'} "
                     f"| {image['source']}: {image['path']}{member} | {image['width']}x"
                     f"{image['height']} | {image['licence']} | {image.get('author') or '-'} | "
                     f"{image.get('note', '')} |")
    return "\n".join(lines) + "\n"


def build(out, packages, manifest=None, download=False, overwrite=False):
    """Write the corpus into ``out`` (see the module docstring).

    Returns the counts written: {"train": n, "heldout": m}.
    """
    manifest = manifest if manifest is not None else load_manifest()
    check_manifest(manifest)
    out = Path(out)
    for split in ("train", "heldout"):
        folder = out / split
        if folder.is_dir() and any(folder.iterdir()):
            if not overwrite:
                raise CorpusError(f"{folder} is not empty: pass --overwrite to replace it")
            shutil.rmtree(folder)
    roots = package_roots(manifest, packages, download)
    images = verified(manifest, roots)          # every file checked before anything is written
    for split in ("train", "heldout", "licences"):
        (out / split).mkdir(parents=True, exist_ok=True)
    written, counts = {}, {"train": 0, "heldout": 0}
    for image, data in images:
        if image["held_out"]:
            png, _ = held_out_png(data, manifest.get("held_out_long_side", 768))
            written[image["name"]] = f"heldout/{image['name']}.png"
            (out / written[image["name"]]).write_bytes(png)
            counts["heldout"] += 1
        else:
            written[image["name"]] = f"train/{train_file_name(image)}"
            (out / written[image["name"]]).write_bytes(data)
            counts["train"] += 1
    for name, source in manifest["sources"].items():
        if source["kind"] == "deb":
            shutil.copyfile(roots[name] / source["copyright"],
                            out / "licences" / f"{name}.copyright")
    (out / "SOURCES.md").write_text(sources_text(manifest, written))
    return counts


def main(argv=None):
    """The command line (see the module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder to write train/, heldout/, SOURCES.md into")
    parser.add_argument("--packages", type=Path, required=True, metavar="DIR",
                        help="folder of the Debian packages: .deb files or trees DIR/<package>/")
    parser.add_argument("--download", action="store_true",
                        help="fetch the missing .deb files into DIR with apt-get download first")
    parser.add_argument("--manifest", type=Path, default=MANIFEST,
                        help=f"the list of photos (default {MANIFEST.name} beside this script)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace OUT/train and OUT/heldout if they hold files")
    args = parser.parse_args(argv)
    try:
        manifest = load_manifest(args.manifest)
        counts = build(args.out, args.packages, manifest, args.download, args.overwrite)
    except (CorpusError, OSError, subprocess.CalledProcessError, json.JSONDecodeError) as exc:
        print(f"build_corpus: {exc}", file=sys.stderr)
        return 1
    pixels = {split: sum(i["width"] * i["height"] for i in manifest["images"]
                         if i["held_out"] == (split == "heldout")) / 1e6 for split in counts}
    print(f"{counts['train']} training photos ({pixels['train']:.0f} megapixels) in "
          f"{args.out / 'train'}, {counts['heldout']} held out ({pixels['heldout']:.0f} megapixels "
          f"before scaling to {manifest.get('held_out_long_side', 768)} px) in "
          f"{args.out / 'heldout'}; sources and licences in {args.out / 'SOURCES.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
