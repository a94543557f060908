"""Evaluating a codec model on full images: what :meth:`gdnflow.train.Trainer.evaluate` measures.

Each image is padded (reflect) to multiples of the model's downsampling,
coded with rounding (eval mode, no gradients), and measured against the
original: bpp counts the padded latent's bits over the original pixels.
"""
import math

import numpy as np

from gdnflow.autograd import no_grad
from gdnflow.data.images import pad_to_multiple
from gdnflow.tensor import Tensor
from gdnflow.train.losses import bits_per_pixel, ms_ssim, psnr

#: The mean values of an evaluation.
EVALUATION_KEYS = ("loss", "bpp", "mse", "psnr", "ms_ssim")


def evaluate_images(model, images, lmbda, device, keep=0):
    """(rows, kept): one row of ``EVALUATION_KEYS`` per (name, image) of ``images``, and the
    first ``keep`` as (name, original, reconstruction, bpp, psnr).

    ``ms_ssim`` is NaN for images too small for its five scales. The model is
    put in eval mode for the images and back in training mode after.
    """
    rows, kept = [], []
    model.eval()
    try:
        with no_grad():
            for name, image in images:
                h, w = image.shape[-2:]
                x = Tensor(pad_to_multiple(image, model.downsampling)[None], device=device)
                out = model(x)
                bpp = bits_per_pixel(out["likelihoods"], h * w).item()
                x_hat = np.clip(out["x_hat"].numpy()[0, :, :h, :w], 0, 1)
                mse = float(np.mean((x_hat.astype(np.float64) - image) ** 2))
                try:
                    quality = ms_ssim(image, x_hat)
                except ValueError:          # smaller side <= 160: no five scales
                    quality = float("nan")
                rows.append({"bpp": bpp, "mse": mse, "psnr": psnr(image, x_hat),
                             "ms_ssim": quality, "loss": lmbda * 255 ** 2 * mse + bpp})
                if len(kept) < keep:
                    kept.append((name, image, x_hat, bpp, rows[-1]["psnr"]))
    finally:
        model.train()
    return rows, kept


def mean_of_rows(rows):
    """The mean of each of ``EVALUATION_KEYS`` over ``rows``, leaving out NaNs (NaN if none)."""
    result = {}
    for key in EVALUATION_KEYS:
        values = [r[key] for r in rows if math.isfinite(r[key])]
        result[key] = float(np.mean(values)) if values else float("nan")
    return result
