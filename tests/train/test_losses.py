"""Rate-distortion loss and the metrics: PSNR, MS-SSIM (against values from
pytorch_msssim, the implementation CompressAI evaluates with)."""
import math

import numpy as np
import pytest

import gdnflow as gf
from gdnflow.train.losses import (LAMBDAS, RateDistortionLoss, bits_per_pixel, ms_ssim,
                                  mse_to_psnr, psnr)


def test_rate_distortion_loss_formula(rng):
    x = rng.random((2, 3, 8, 8))
    x_hat = x + rng.normal(0, 0.1, x.shape)
    p = rng.uniform(0.01, 1, (2, 5, 2, 2))
    out = {"x_hat": gf.tensor(x_hat, device="numpy", dtype=np.float64),
           "likelihoods": {"y": gf.tensor(p, device="numpy", dtype=np.float64)}}
    terms = RateDistortionLoss(0.0067)(out, gf.tensor(x, device="numpy", dtype=np.float64))
    bpp = -np.log2(p).sum() / (2 * 8 * 8)
    mse = np.mean((x_hat - x) ** 2)
    assert terms["bpp"].item() == pytest.approx(bpp, rel=1e-12)
    assert terms["mse"].item() == pytest.approx(mse, rel=1e-12)
    assert terms["loss"].item() == pytest.approx(0.0067 * 255 ** 2 * mse + bpp, rel=1e-12)


def test_bits_per_pixel_adds_every_likelihood_tensor():
    half = gf.tensor(np.full((1, 2, 2, 2), 0.5), device="numpy")
    quarter = gf.tensor(np.full((1, 1, 2, 2), 0.25), device="numpy")
    assert bits_per_pixel({"y": half, "z": quarter}, 16).item() == pytest.approx((8 + 8) / 16)


def test_lambda_ladder_is_compressais():
    assert LAMBDAS[0] == 0.0018 and LAMBDAS[6] == 0.0932 and len(LAMBDAS) == 8
    with pytest.raises(ValueError):
        RateDistortionLoss(-1)


def test_psnr():
    x = np.zeros((3, 4, 4))
    assert psnr(x, x + 0.1) == pytest.approx(20.0)
    assert psnr(x, x) == math.inf
    assert mse_to_psnr(0.01) == pytest.approx(20.0)
    assert psnr(x * 255, x * 255 + 25.5, data_range=255) == pytest.approx(20.0)


def blocky_pair(shape, noise):
    """A piecewise-constant image and a noisy copy (fixed seed: reference values below)."""
    rng = np.random.default_rng(2024)
    base = rng.random((shape[0], 3, shape[2] // 8 + 1, shape[3] // 8 + 1))
    x = np.repeat(np.repeat(base, 8, axis=2), 8, axis=3)[:, :, :shape[2], :shape[3]]
    return x, np.clip(x + noise * rng.standard_normal(shape), 0, 1)


# pytorch_msssim 1.0.0 ms_ssim(x, y, data_range=1, size_average=False) on blocky_pair(shape, 0.2).
@pytest.mark.parametrize("shape, reference", [((2, 3, 176, 192), [0.93049819, 0.92702471]),
                                              ((1, 3, 165, 171), [0.91734015])])
def test_ms_ssim_matches_pytorch_msssim(shape, reference):
    x, y = blocky_pair(shape, 0.2)
    np.testing.assert_allclose(ms_ssim(x, y), reference, atol=1e-6)


def test_ms_ssim_properties():
    x, y = blocky_pair((1, 3, 170, 170), 0.1)
    assert ms_ssim(x[0], x[0]) == pytest.approx(1.0)
    assert ms_ssim(x[0], y[0]) == pytest.approx(ms_ssim(y[0], x[0]))
    _, worse = blocky_pair((1, 3, 170, 170), 0.3)
    assert ms_ssim(x[0], worse[0]) < ms_ssim(x[0], y[0]) < 1
    with pytest.raises(ValueError, match="too small"):
        ms_ssim(x[0, :, :160], y[0, :, :160])
