"""gdnflow demo: a shipped codec fine-tuned, then tested on held-out photos beside JPEG and WebP."""
import json

import numpy as np
import pytest
from PIL import Image

from gdnflow.codec.codec import Codec, read_image
from gdnflow.demo import HELD_OUT, run_demo, split_photos
from gdnflow.codec.references import quality_metrics


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Smooth random 'photos' with noise: three to train on, and the two held-out names."""
    folder = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(11)
    paths = []
    for name in ("a.png", "b.png", "c.png", *HELD_OUT):
        coarse = rng.random((6, 8, 3))
        image = np.kron(coarse, np.ones((24, 24, 1)))[:136, :184] + 0.1 * rng.random((136, 184, 3))
        Image.fromarray(np.clip(255 * image / 1.1, 0, 255).astype(np.uint8)).save(folder / name)
        paths.append(folder / name)
    return paths


def test_the_demo_trains_codes_held_out_photos_and_compares_at_the_same_size(photos, tmp_path):
    lines = []
    out = tmp_path / "demo"
    results = run_demo(out, quality=1, steps=2, device="numpy", log=lines.append, photos=photos)
    assert results["steps"] == 2 and [p["photo"] for p in results["photos"]] == list(HELD_OUT)
    checkpoint = out / "finetune" / "checkpoint.h5"
    codec = Codec.from_checkpoint(checkpoint, "numpy")
    for entry, path in zip(results["photos"], photos[3:]):
        ours = entry["fine_tuned"]
        # The .gdn file is real: it decodes with the fine-tuned checkpoint to the saved picture.
        data = (out / f"{path.stem}.gdn").read_bytes()
        assert len(data) == ours["bytes"]
        decoded = codec.decompress(data)
        assert np.array_equal(decoded, read_image(out / f"{path.stem}.png"))
        assert quality_metrics(read_image(path), decoded)["psnr"] == pytest.approx(ours["psnr"])
        assert (out / f"{path.stem}.shipped.gdn").stat().st_size == entry["shipped"]["bytes"]
        for name, extension in (("JPEG", "jpg"), ("WebP", "webp")):
            reference = entry[name]
            if reference is None:
                continue
            # The saved reference file is no larger than ours.
            saved = out / f"{path.stem}.{name.lower()}.{extension}"
            assert saved.stat().st_size == reference["bytes"] <= ours["bytes"]
    written = json.loads((out / "demo.json").read_text())
    assert [e["fine_tuned"]["bytes"] for e in written["photos"]] == \
        [e["fine_tuned"]["bytes"] for e in results["photos"]]
    with Image.open(out / "comparison.png") as sheet:
        assert sheet.size[0] >= 3 * 320 and sheet.size[1] >= 2 * 320
    assert (out / "finetune" / "curves.png").is_file()
    assert "| photo | gdnflow bpp |" in lines[-1] and "comparison.png" in lines[-1]


def test_the_demo_needs_both_held_out_photos(photos, tmp_path):
    with pytest.raises(Exception, match="needs scikit-image's coffee.png and chelsea.png"):
        split_photos(photos[:3])
    with pytest.raises(ValueError, match="--quality must be one of 1, 2, 3, 4"):
        run_demo(tmp_path / "x", quality=5, device="numpy", photos=photos)
    assert not (tmp_path / "x").exists()
