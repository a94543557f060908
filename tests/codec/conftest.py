"""Fixtures of the codec tests: a small factorized prior with a non-trivial
entropy model, its checkpoint, and odd-sized PNG and JPEG images."""
import numpy as np
import pytest

from gdnflow.models.factorized_prior import FactorizedPrior


def make_model(seed=0, latent_scale=30.0):
    """A FactorizedPrior(8, 12) on NumPy whose entropy model is not the initial one.

    The density's parameters are moved off their initialisation and the
    quantiles set to asymmetric values around non-zero medians (as training
    leaves them), and g_a's last convolution is scaled so that the latents
    span several integers, some beyond the supports (escapes).
    """
    rng = np.random.default_rng(seed)
    model = FactorizedPrior(8, 12, seed=seed, device="numpy")
    state = model.state_dict()
    for name, value in state.items():
        if ".matrices." in name:
            state[name] = value + rng.normal(0, 0.3, value.shape)
        elif ".factors." in name:
            state[name] = rng.normal(0, 1.0, value.shape)
    channels = state["entropy_bottleneck.quantiles"].shape[0]
    medians = rng.uniform(-0.6, 0.6, channels)
    state["entropy_bottleneck.quantiles"] = np.stack(
        [medians - rng.uniform(1.5, 5, channels), medians, medians + rng.uniform(1.5, 5, channels)],
        axis=1)[:, None, :]
    state["g_a.6.weight"] = state["g_a.6.weight"] * latent_scale
    model.load_state_dict(state)
    return model.eval()


def smooth_image(rng, height, width):
    """A uint8 (H, W, 3) image: smooth colour fields plus a little noise (photo-like)."""
    from PIL import Image
    coarse = rng.integers(0, 256, (height // 8 + 2, width // 8 + 2, 3), dtype=np.uint8)
    image = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BILINEAR), np.int16)
    return np.clip(image + rng.integers(-6, 7, image.shape), 0, 255).astype(np.uint8)


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
