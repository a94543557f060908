"""Fixtures of the codec tests: a small factorized prior with a non-trivial
entropy model, its checkpoint, and odd-sized PNG and JPEG images."""
import numpy as np
import pytest

from codec_kit import make_model, smooth_image


@pytest.fixture(scope="module")
def model():
    """The codec tests' model (see :func:`make_model`)."""
    return make_model()


@pytest.fixture
def checkpoint(model, tmp_path):
    """The model saved as a gdnflow checkpoint (no optimiser)."""
    from gdnflow.io.checkpoint import save_checkpoint
    path = tmp_path / "ckpt" / "model.h5"
    path.parent.mkdir()
    save_checkpoint(path, model, extra={"train_config": {"lmbda": 0.01}})
    return path


@pytest.fixture
def image_files(tmp_path):
    """{"png": path, "jpg": path}: a 97x131 PNG and a 131x97 JPEG, in their own folder."""
    from PIL import Image
    rng = np.random.default_rng(5)
    folder = tmp_path / "images"
    folder.mkdir()
    Image.fromarray(smooth_image(rng, 97, 131)).save(folder / "odd.png")
    Image.fromarray(smooth_image(rng, 131, 97)).save(folder / "odd.jpg", quality=90)
    return {"png": folder / "odd.png", "jpg": folder / "odd.jpg"}


@pytest.fixture(scope="module")
def other_model():
    """A second model, of the same shape but other weights."""
    return make_model(seed=1)


@pytest.fixture(scope="module")
def small_image():
    """A 40x56 uint8 image."""
    return smooth_image(np.random.default_rng(3), 40, 56)
