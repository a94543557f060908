"""Fixtures of the fault suite; the tools themselves are in ``tests/fault_kit.py``."""
import numpy as np
import pytest

from fault_kit import run_gdnflow
from gdnflow.io.checkpoint import save_checkpoint
from gdnflow.models.factorized_prior import FactorizedPrior


@pytest.fixture
def cli(tmp_path):
    """``cli(*args, **kwargs)``: :func:`run_gdnflow` in the test's temporary folder."""
    def run(*args, cwd=tmp_path, **kwargs):
        return run_gdnflow(*args, cwd=cwd, **kwargs)
    return run


@pytest.fixture
def codec_checkpoint(tmp_path):
    """A small factorized prior's checkpoint (N=8, M=12) in the test's folder."""
    path = tmp_path / "codec.h5"
    save_checkpoint(path, FactorizedPrior(8, 12, seed=0, device="numpy").eval())
    return path


@pytest.fixture
def photo(tmp_path):
    """A 70x53 RGB PNG of smooth colours plus noise."""
    from PIL import Image
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:70, 0:53]
    image = np.stack([x * 4, y * 3, (x + y) * 2], axis=-1) + rng.integers(0, 20, (70, 53, 3))
    path = tmp_path / "photo.png"
    Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(path)
    return path
