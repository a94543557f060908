"""The shipped codecs: found by architecture and quality, their hashes checked,
used by ``gdnflow compress --quality`` and found again by ``decompress``."""
import shutil

import numpy as np
import pytest

from gdnflow.codec import CodecError, pretrained, read_image
from gdnflow.codec import zoo
from gdnflow.codec.cli import main

from codec_kit import smooth_image


def test_each_shipped_model_is_found_and_matches_its_hash():
    for entry in zoo.SHIPPED:
        path = zoo.shipped_checkpoint(entry.architecture, entry.quality)
        assert path.name == entry.file


@pytest.mark.parametrize("architecture", ["factorized_prior", "hyperprior"])
def test_pretrained_codec_round_trips(architecture):
    codec = pretrained(architecture, quality=1, device="numpy")
    assert (codec.model.N, codec.model.M) == (128, 192)
    image = smooth_image(np.random.default_rng(2), 48, 64)
    decoded = codec.decompress(codec.compress(image))
    assert decoded.shape == image.shape
    assert np.mean((decoded.astype(float) - image) ** 2) < np.var(image.astype(float))


def test_unknown_models_and_damaged_files_are_refused(tmp_path):
    with pytest.raises(CodecError, match="no shipped factorized_prior model of quality 9; "
                       "shipped: factorized_prior quality 1, 2, 3, 4; hyperprior quality 1, "
                       "2, 3, 4"):
        zoo.shipped_checkpoint("factorized_prior", 9)
    entry = zoo.SHIPPED[0]
    damaged = tmp_path / entry.file
    shutil.copy(zoo.shipped_checkpoint(entry.architecture, entry.quality), damaged)
    with open(damaged, "r+b") as f:
        f.seek(1000)
        f.write(b"\0\1\2\3")
    with pytest.raises(CodecError, match=f"{entry.file}: not the shipped {entry.file}"):
        zoo.shipped_checkpoint(entry.architecture, entry.quality, folders=[tmp_path])
    with pytest.raises(CodecError, match="is in none of"):
        zoo.shipped_checkpoint(entry.architecture, entry.quality, folders=[tmp_path / "none"])


def test_compress_with_a_quality_and_decompress_without_a_checkpoint(tmp_path, capsys,
                                                                     monkeypatch):
    from PIL import Image
    monkeypatch.chdir(tmp_path)          # no ./checkpoints: the shipped folders are searched
    Image.fromarray(smooth_image(np.random.default_rng(3), 40, 56)).save(tmp_path / "a.png")
    assert main(["compress", "a.png", "--quality", "3", "--device", "numpy"]) == 0
    assert "the shipped hyperprior of quality 3 (hyperprior_q3.h5)" in capsys.readouterr().out
    assert main(["compress", "a.png", "-o", "f.gdn", "--model", "factorized_prior",
                 "--device", "numpy"]) == 0
    assert "the shipped factorized prior of quality 2 (codec_q2.h5)" in capsys.readouterr().out
    for stem, architecture, quality in (("a", "hyperprior", 3), ("f", "factorized_prior", 2)):
        assert main(["decompress", f"{stem}.gdn", "-o", f"{stem}_hat.png",
                     "--device", "numpy"]) == 0
        expected = pretrained(architecture, quality, device="numpy").decompress(
            (tmp_path / f"{stem}.gdn").read_bytes())
        assert np.array_equal(read_image(tmp_path / f"{stem}_hat.png"), expected)
    assert main(["compress", "a.png", "-o", "c.gdn", "--quality", "3", "--checkpoint",
                 str(zoo.shipped_checkpoint("factorized_prior", 3)), "--device", "numpy"]) == 1
    assert "give them or --checkpoint, not both" in capsys.readouterr().err
    assert main(["compress", "a.png", "-o", "c.gdn", "--model", "hyperprior", "--checkpoint",
                 str(zoo.shipped_checkpoint("factorized_prior", 3)), "--device", "numpy"]) == 1
    assert "give them or --checkpoint, not both" in capsys.readouterr().err
    assert not (tmp_path / "c.gdn").exists()
