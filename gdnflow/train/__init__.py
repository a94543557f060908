"""Training image-compression models: the rate-distortion loss, metrics, the
trainer (checkpoints, resume, NaN stops, signals), run folders owned by one
process, and the command line::

    from gdnflow.train import TrainConfig, train
    trainer = train(TrainConfig(data="photos/", out_dir="runs/q2", steps=10_000, lmbda=0.0067))

``train`` owns the run folder (locked, never replaced unasked) and resumes
with ``resume=True``; ``Trainer(config).run()`` trains without those checks.
"""
from gdnflow.train.losses import (LAMBDAS, RateDistortionLoss, bits_per_pixel, ms_ssim,
                                  mse_to_psnr, psnr)
from gdnflow.train.numerics import NonFiniteError, cast_module
from gdnflow.train.run_folder import RunExistsError, RunFolder, RunLockedError
from gdnflow.train.stopping import RunStopped
from gdnflow.train.launch import train
from gdnflow.train.trainer import TrainConfig, Trainer

__all__ = ["TrainConfig", "Trainer", "train", "RateDistortionLoss", "bits_per_pixel", "psnr",
           "mse_to_psnr", "ms_ssim", "LAMBDAS", "NonFiniteError", "cast_module", "RunFolder",
           "RunExistsError", "RunLockedError", "RunStopped"]
