"""Rate-distortion loss (differentiable, gdnflow operators) and image quality
metrics (PSNR, MS-SSIM: NumPy, for evaluation).

Rate: bits per pixel of the latent under the entropy model,
``bpp = sum(-log2 p(y_hat)) / (N H W)`` with N, H, W those of the *image*.
Loss: ``lambda * 255^2 * MSE(x_hat, x) + bpp``, CompressAI's
``RateDistortionLoss`` for images in [0, 1] (the 255^2 makes lambda the
weight of an MSE on the 0-255 scale).
"""
import math

import numpy as np

from gdnflow import ops

#: CompressAI's lambdas for MSE-trained models, qualities 1 to 8.
LAMBDAS = (0.0018, 0.0035, 0.0067, 0.0130, 0.0250, 0.0483, 0.0932, 0.1800)


def bits_per_pixel(likelihoods, num_pixels):
    """sum over every tensor in ``likelihoods`` (a dict or a list) of sum(-log2 p), / num_pixels."""
    values = likelihoods.values() if isinstance(likelihoods, dict) else likelihoods
    total = None
    for p in values:
        bits = ops.log(p).sum()
        total = bits if total is None else total + bits
    return total * (-1.0 / (math.log(2) * num_pixels))


class RateDistortionLoss:
    """``lmbda * 255^2 * MSE + bpp`` for a model output dict and the target images.

    ``loss(output, x)`` takes the model's output (``x_hat``, ``likelihoods``)
    and the images x (N, 3, H, W) in [0, 1]; returns a dict of Tensors:
    ``loss``, ``bpp`` and ``mse`` (all one-element).
    """

    def __init__(self, lmbda=0.0130):
        if not lmbda >= 0:
            raise ValueError(f"RateDistortionLoss: lambda must be >= 0, got {lmbda!r}")
        self.lmbda = float(lmbda)

    def __call__(self, output, x):
        n, _, h, w = x.shape
        bpp = bits_per_pixel(output["likelihoods"], n * h * w)
        error = output["x_hat"] - x
        mse = (error * error).mean()
        loss = mse * (self.lmbda * 255.0 ** 2) + bpp
        return {"loss": loss, "bpp": bpp, "mse": mse}

    def __repr__(self):
        return f"RateDistortionLoss(lmbda={self.lmbda:g})"


# ---------------------------------------------------------------- metrics --
def psnr(x, y, data_range=1.0):
    """Peak signal-to-noise ratio in dB of NumPy images x, y (``inf`` where they are equal).

    ``10 log10(data_range^2 / mean((x - y)^2))`` over all elements.
    """
    mse = float(np.mean((np.asarray(x, np.float64) - np.asarray(y, np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * math.log10(data_range ** 2 / mse)


def mse_to_psnr(mse, data_range=1.0):
    """The PSNR (dB) of a mean squared error."""
    return float("inf") if mse <= 0 else 10 * math.log10(data_range ** 2 / mse)


#: Weights of the five scales (Wang, Simoncelli, Bovik 2003, from their
#: psychovisual measurements), finest first.
MS_SSIM_WEIGHTS = (0.0448, 0.2856, 0.3001, 0.2363, 0.1333)


def gaussian_window(size=11, sigma=1.5):
    """The normalised 1-D Gaussian of ``size`` taps (the SSIM window is its outer product)."""
    offsets = np.arange(size, dtype=np.float64) - (size - 1) / 2
    g = np.exp(-offsets ** 2 / (2 * sigma ** 2))
    return g / g.sum()


def _filter_valid(images, window):
    """Separable 'valid' filtering of (..., H, W) images by the window's outer product."""
    k = len(window)
    rows = np.lib.stride_tricks.sliding_window_view(images, k, axis=-2) @ window
    return np.lib.stride_tricks.sliding_window_view(rows, k, axis=-1) @ window


def _ssim_terms(x, y, window, data_range, k1=0.01, k2=0.03):
    """Per image and channel: (mean SSIM, mean contrast-structure term) over valid windows."""
    c1, c2 = (k1 * data_range) ** 2, (k2 * data_range) ** 2
    mu_x, mu_y = _filter_valid(x, window), _filter_valid(y, window)
    var_x = _filter_valid(x * x, window) - mu_x ** 2
    var_y = _filter_valid(y * y, window) - mu_y ** 2
    cov = _filter_valid(x * y, window) - mu_x * mu_y
    cs = (2 * cov + c2) / (var_x + var_y + c2)
    luminance = (2 * mu_x * mu_y + c1) / (mu_x ** 2 + mu_y ** 2 + c1)
    return (luminance * cs).mean(axis=(-2, -1)), cs.mean(axis=(-2, -1))


def ms_ssim(x, y, data_range=1.0, weights=MS_SSIM_WEIGHTS, window_size=11, sigma=1.5):
    """Multi-scale SSIM (Wang, Simoncelli, Bovik 2003) of NumPy images (N, C, H, W) or (C, H, W).

    At each of the ``len(weights)`` scales the images are filtered with an
    11x11 Gaussian window (sigma 1.5, 'valid' positions only), giving per
    pixel luminance l = (2 mu_x mu_y + C1) / (mu_x^2 + mu_y^2 + C1) and
    contrast-structure cs = (2 cov + C2) / (var_x + var_y + C2), C1 =
    (0.01 L)^2, C2 = (0.03 L)^2, L = ``data_range``. Between scales both
    images are averaged over 2x2 blocks (an odd side gets a leading row or
    column of zeros first, as pytorch_msssim's pooling pads, so that scores
    agree with CompressAI's evaluation). Per image and channel::

        MS-SSIM = mean(l * cs at the coarsest scale)^w_M * prod_{j<M} mean(cs_j)^w_j

    (negative means clipped to 0), then averaged over channels; returns one
    value per image as an array (N,), or a float for a (C, H, W) pair. The
    smaller side must exceed (window_size - 1) * 2^(scales - 1) (160 for the
    defaults), as the coarsest scale still needs a full window.
    """
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    single = x.ndim == 3
    if single:
        x, y = x[None], y[None]
    if x.shape != y.shape or x.ndim != 4:
        raise ValueError(f"ms_ssim: expected two images of one shape (N, C, H, W) or (C, H, W), "
                         f"got {x.shape} and {y.shape}")
    scales = len(weights)
    smallest = (window_size - 1) * 2 ** (scales - 1)
    if min(x.shape[-2:]) <= smallest:
        raise ValueError(f"ms_ssim: images of {x.shape[-2]}x{x.shape[-1]} are too small for "
                         f"{scales} scales with an {window_size}-pixel window: the smaller "
                         f"side must exceed {smallest}")
    window = gaussian_window(window_size, sigma)
    factors = []
    for j in range(scales):
        ssim, cs = _ssim_terms(x, y, window, data_range)
        factors.append(np.maximum(ssim if j == scales - 1 else cs, 0.0) ** weights[j])
        if j < scales - 1:
            x, y = _average_2x2(x), _average_2x2(y)
    value = np.prod(factors, axis=0).mean(axis=1)
    return float(value[0]) if single else value


def _average_2x2(images):
    """Means of 2x2 blocks. An odd side first gets a zero row (column) in front:
    pytorch_msssim's average pooling with padding 1 (zeros counted), so that
    scores agree with CompressAI's evaluation on any size."""
    h, w = images.shape[-2:]
    if h % 2 or w % 2:
        pads = [(0, 0)] * (images.ndim - 2) + [(h % 2, 0), (w % 2, 0)]
        images = np.pad(images, pads)
    return 0.25 * (images[..., 0::2, 0::2] + images[..., 1::2, 0::2]
                   + images[..., 0::2, 1::2] + images[..., 1::2, 1::2])


def describe_evaluation(result):
    """One line summing up an evaluation record (a Trainer.evaluate result)."""
    if not result:
        return "evaluation: no images"
    quality = f", MS-SSIM {result['ms_ssim']:.4f}" if math.isfinite(result["ms_ssim"]) else ""
    return (f"step {result['step']}: eval on {result['images']} images: loss {result['loss']:.4f}, "
            f"{result['bpp']:.4f} bpp, PSNR {result['psnr']:.2f} dB{quality}")
