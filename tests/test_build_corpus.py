"""checkpoints/build_corpus.py: the committed manifest is consistent, and the script builds
the train and held-out split from a small fake package folder, refusing a file whose hash
differs with an error naming it."""
import hashlib
import importlib.util
import io
import json
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

Image = pytest.importorskip("PIL.Image")

SCRIPT = Path(__file__).resolve().parents[1] / "checkpoints" / "build_corpus.py"


@pytest.fixture(scope="module")
def corpus():
    spec = importlib.util.spec_from_file_location("build_corpus", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_manifest_is_consistent(corpus):
    manifest = corpus.load_manifest()
    images = manifest["images"]
    held_out = [i for i in images if i["held_out"]]
    train = [i for i in images if not i["held_out"]]
    assert 20 <= len(held_out) <= 30
    assert sum(i["width"] * i["height"] for i in train) > 250e6        # "a few hundred megapixels"
    assert all(i["licence"].strip() and i["author"].strip() for i in images)
    assert not {i["sha256"] for i in train} & {i["sha256"] for i in held_out}
    assert not {i["name"] for i in train} & {i["name"] for i in held_out}
    for source in manifest["sources"].values():
        assert source["version"] and (source["kind"] == "pypi" or source["copyright"])


@pytest.mark.parametrize("spoil, message", [
    (lambda images: images[1].update(sha256=images[0]["sha256"]), "have the same sha256"),
    (lambda images: images[1].update(name=images[0]["name"]), "have the same name"),
    (lambda images: images[2].update(licence=" "), "has no licence"),
    (lambda images: images[2].pop("licence"), "lacks licence"),
    (lambda images: images[2].update(held_out="yes"), "held_out must be true or false"),
    (lambda images: images[2].update(source="nowhere"), "names the source 'nowhere'"),
])
def test_an_inconsistent_manifest_is_refused(corpus, spoil, message):
    manifest = corpus.load_manifest()
    spoil(manifest["images"])
    with pytest.raises(corpus.CorpusError, match=message):
        corpus.check_manifest(manifest)


def photo(size, seed, fmt):
    """Bytes of a smooth RGB image of ``size`` (width, height) in ``fmt``."""
    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8))
    buffer = io.BytesIO()
    coarse.resize(size, Image.BICUBIC).save(buffer, format=fmt)
    return buffer.getvalue()


def eet(entries):
    """An Eet (version 2) archive of ``entries`` {name: bytes}, stored uncompressed."""
    names = b"".join(name.encode() + b"\0" for name in entries)
    start = 12 + 24 * len(entries)
    data_at = start + len(names)
    rows, name_at, blobs = [], start, b""
    for name, blob in entries.items():
        rows.append(struct.pack(">6i", data_at + len(blobs), len(blob), len(blob), name_at,
                                len(name) + 1, 0))
        name_at += len(name) + 1
        blobs += blob
    return struct.pack(">3I", 0x1EE70F42, len(entries), 0) + b"".join(rows) + names + blobs


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A package folder with one unpacked Debian package and an installed fake PyPI package,
    and the manifest of their five photos (two held out)."""
    packages = tmp_path / "packages"
    tree = packages / "fake-photos"
    files = {"usr/share/backgrounds/a.jpg": photo((400, 300), 1, "JPEG"),
             "usr/share/backgrounds/b.png": photo((1000, 600), 2, "PNG"),
             "usr/share/backgrounds/c.jpg": photo((300, 500), 3, "JPEG")}
    inside = photo((640, 360), 4, "JPEG")
    files["usr/share/themes/d.edj"] = eet({"edje/file": b"\x01\x02", "edje/images/0": inside})
    files["usr/share/doc/fake-photos/copyright"] = b"Files: *\nLicense: CC0-1.0\n"
    for path, data in files.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_bytes(data)
    site = tmp_path / "site"
    (site / "fakepics" / "data").mkdir(parents=True)
    (site / "fakepics" / "__init__.py").write_text("")
    small = photo((300, 200), 5, "PNG")
    (site / "fakepics" / "data" / "e.png").write_bytes(small)
    monkeypatch.syspath_prepend(str(site))

    def entry(name, source, path, data, held_out, member=None):
        width, height = Image.open(io.BytesIO(data)).size
        image = dict(name=name, source=source, path=path, licence="CC0-1.0", author="tester",
                     sha256=hashlib.sha256(data).hexdigest(), width=width, height=height,
                     held_out=held_out)
        return {**image, "member": member} if member else image

    manifest = {"format": 1, "held_out_long_side": 768, "sources": {
        "fake-photos": {"kind": "deb", "version": "1.0-1",
                        "copyright": "usr/share/doc/fake-photos/copyright"},
        "fakepics": {"kind": "pypi", "module": "fakepics", "version": "0.1"}}, "images": [
        entry("a", "fake-photos", "usr/share/backgrounds/a.jpg", files[
            "usr/share/backgrounds/a.jpg"], False),
        entry("b", "fake-photos", "usr/share/backgrounds/b.png", files[
            "usr/share/backgrounds/b.png"], True),
        entry("c", "fake-photos", "usr/share/backgrounds/c.jpg", files[
            "usr/share/backgrounds/c.jpg"], False),
        entry("d", "fake-photos", "usr/share/themes/d.edj", inside, False, "edje/images/0"),
        entry("e", "fakepics", "data/e.png", small, True)]}
    return packages, manifest, files, small


def test_build_writes_the_split_and_the_sources(corpus, fake, tmp_path):
    packages, manifest, files, small = fake
    out = tmp_path / "corpus"
    assert corpus.build(out, packages, manifest) == {"train": 3, "heldout": 2}
    assert sorted(p.name for p in (out / "train").iterdir()) == ["a.jpg", "c.jpg", "d.jpg"]
    assert sorted(p.name for p in (out / "heldout").iterdir()) == ["b.png", "e.png"]
    # Training files are the sources' bytes; the Eet member is the JPEG stored in it.
    assert (out / "train" / "a.jpg").read_bytes() == files["usr/share/backgrounds/a.jpg"]
    assert Image.open(out / "train" / "d.jpg").size == (640, 360)
    # Held out: scaled to 768 on the long side when larger, else as they are; RGB PNG.
    b = Image.open(out / "heldout" / "b.png")
    assert (b.format, b.mode, b.size) == ("PNG", "RGB", (768, 461))
    e = np.asarray(Image.open(out / "heldout" / "e.png"))
    np.testing.assert_array_equal(e, np.asarray(Image.open(io.BytesIO(small)).convert("RGB")))
    sources = (out / "SOURCES.md").read_text()
    assert "| fake-photos (Debian) | 1.0-1 | 4 (1) |" in sources
    assert "| heldout/b.png | heldout | fake-photos: usr/share/backgrounds/b.png |" in sources
    assert "usr/share/themes/d.edj (edje/images/0)" in sources
    assert (out / "licences" / "fake-photos.copyright").read_text().endswith("CC0-1.0\n")
    with pytest.raises(corpus.CorpusError, match="is not empty: pass --overwrite"):
        corpus.build(out, packages, manifest)
    assert corpus.build(out, packages, manifest, overwrite=True)["train"] == 3


def test_a_hash_mismatch_is_refused_naming_the_file(corpus, fake, tmp_path, capsys):
    packages, manifest, files, _ = fake
    changed = packages / "fake-photos" / "usr/share/backgrounds/c.jpg"
    changed.write_bytes(changed.read_bytes() + b"\0")
    out = tmp_path / "corpus"
    with pytest.raises(corpus.CorpusError, match=f"c: {changed} has SHA-256 [0-9a-f]{{64}}, the "
                       f"manifest expects {manifest['images'][2]['sha256']}"):
        corpus.build(out, packages, manifest)
    assert not out.exists()                 # checked before anything is written
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest))
    assert corpus.main([str(out), "--packages", str(packages), "--manifest", str(path)]) == 1
    assert f"build_corpus: c: {changed} has SHA-256" in capsys.readouterr().err
    shutil.rmtree(packages / "fake-photos")
    with pytest.raises(corpus.CorpusError, match="fake-photos 1.0-1 is neither unpacked in .* "
                       "nor a .deb in .*: pass --download"):
        corpus.build(out, packages, manifest)


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb is not installed")
def test_a_deb_file_is_unpacked(corpus, fake, tmp_path):
    packages, manifest, _, _ = fake
    tree = packages / "fake-photos"
    (tree / "DEBIAN").mkdir()
    (tree / "DEBIAN" / "control").write_text(
        "Package: fake-photos\nVersion: 1.0-1\nArchitecture: all\nMaintainer: t <t@t>\n"
        "Description: test\n")
    subprocess.run(["dpkg-deb", "--build", "-Znone", str(tree),
                    str(packages / "fake-photos_1.0-1_all.deb")], check=True, capture_output=True)
    shutil.rmtree(tree)
    assert corpus.build(tmp_path / "corpus", packages, manifest) == {"train": 3, "heldout": 2}
    assert (tree / "usr/share/backgrounds/a.jpg").exists()
