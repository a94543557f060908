"""Fixtures of the training tests: a folder of tiny images and a tiny run's config."""
import numpy as np
import pytest


def write_images(folder):
    """Six small smooth RGB images (one smaller than the 32x32 crop) in ``folder``."""
    from PIL import Image
    rng = np.random.default_rng(11)
    for i, (h, w) in enumerate([(40, 52), (48, 40), (64, 64), (37, 45), (50, 33), (24, 30)]):
        coarse = rng.integers(0, 256, (h // 8 + 2, w // 8 + 2, 3), dtype=np.uint8)
        Image.fromarray(coarse).resize((w, h), Image.BILINEAR).save(folder / f"im{i}.png")
    return folder


@pytest.fixture
def image_folder(tmp_path_factory):
    """Six small smooth RGB images (one smaller than the 32x32 crop)."""
    return write_images(tmp_path_factory.mktemp("images"))


@pytest.fixture(scope="module")
def shared_image_folder(tmp_path_factory):
    """The six images of ``image_folder``, made once for a test module (not to be changed)."""
    return write_images(tmp_path_factory.mktemp("shared-images"))


@pytest.fixture
def tiny_config(image_folder, tmp_path):
    """A TrainConfig for a run small enough for NumPy: N=8, M=12, batches of 2x3x32x32."""
    from gdnflow.train import TrainConfig

    def make(**changes):
        values = dict(data=str(image_folder), out_dir=str(tmp_path / "run"), crop=32, N=8, M=12,
                      batch_size=2, steps=6, lr=3e-3, eval_every=0, checkpoint_every=0,
                      eval_images=2, device="numpy", quiet=True, workers=0, prefetch=2)
        values.update(changes)
        return TrainConfig(**values)
    return make
