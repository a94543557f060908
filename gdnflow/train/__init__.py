"""Training image-compression models: the rate-distortion loss, metrics, the
trainer (checkpoints, resume, NaN stops) and its command line.

    from gdnflow.train import TrainConfig, Trainer
    trainer = Trainer(TrainConfig(data="photos/", steps=10_000, lmbda=0.0067))
    trainer.run()
"""
from gdnflow.train.losses import (LAMBDAS, RateDistortionLoss, bits_per_pixel, ms_ssim,
                                  mse_to_psnr, psnr)
from gdnflow.train.numerics import NonFiniteError, cast_module
from gdnflow.train.trainer import TrainConfig, Trainer, train

__all__ = ["TrainConfig", "Trainer", "train", "RateDistortionLoss", "bits_per_pixel", "psnr",
           "mse_to_psnr", "ms_ssim", "LAMBDAS", "NonFiniteError", "cast_module"]
