"""What defines a training run: :class:`TrainConfig`, saved in the run's checkpoints."""
import dataclasses

from gdnflow.backends import check_device
from gdnflow.data.augment import Augmentation
from gdnflow.models import CODEC_MODELS

#: The values of ``TrainConfig.precision``: float32, TF32 products, bfloat16 or float16
#: under autocast.
TRAIN_PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


@dataclasses.dataclass
class TrainConfig:
    """Everything that defines a training run (saved in its checkpoints).

    Data: ``data`` (a folder of images; None: scikit-image's sample photos),
    ``eval_data`` (a folder; None: the first ``eval_images`` training images,
    which are then not held out; 0: all), ``crop``, ``small_images`` ("pad" or
    "skip"), ``workers`` (threads decoding and resampling images), ``prefetch``
    (batches prepared ahead; with workers > 1 also made at once), ``flip``
    ("horizontal", "both" or "none") and ``scale_range`` ((low, high): random
    downscaling before cropping; (1, 1): none), see :class:`~gdnflow.data.augment.Augmentation`. Model: ``model``
    (a name in :data:`gdnflow.models.CODEC_MODELS`), ``N``, ``M``. Loss:
    ``lmbda``. Optimisation: ``steps``, ``batch_size``, ``lr``, ``aux_lr``, ``clip_norm``,
    ``lr_schedule`` ("constant" or "cosine", with ``warmup_steps``),
    ``precision`` of training: "fp32", "tf32" (the GPU's matrix products in
    TF32, in training and evaluation: :func:`gdnflow.set_matmul_precision`) or
    "bf16" (the forward and loss of each step under ``gdnflow.autocast("bf16")``:
    products, convolutions and elementwise maps in bfloat16, float32 parameters
    and gradients; evaluation in float32) or "fp16" (the same in float16, with
    dynamic loss scaling: :class:`gdnflow.optim.DynamicLossScaler`; a step
    whose gradients overflow is skipped; the steps run eagerly whatever
    ``graph`` says, since the scaler reads each step's gradients back), ``graph``
    (True: :meth:`~gdnflow.train.Trainer.run` trains through a compiled step, one CUDA graph
    replayed per step on the GPU, its values read back every ``SYNC_EVERY``
    steps without stopping the GPU; False: the eager step, read back every step).
    Bookkeeping: ``out_dir``, ``eval_every``, ``checkpoint_every`` (0:
    only at the end), ``seed``, ``device`` (None: the default device),
    ``quiet`` (no progress bar), ``init`` (a checkpoint of the same model and size whose
    weights start the run: fine-tuning, e.g. from a shipped codec; the optimisers, the
    schedule and the step start afresh; None: ``seed``'s random weights).
    """

    data: str = None
    eval_data: str = None
    out_dir: str = "runs/factorized_prior"
    steps: int = 100_000
    batch_size: int = 16
    crop: int = 256
    lmbda: float = 0.0130
    model: str = "factorized_prior"
    N: int = 128
    M: int = 192
    lr: float = 1e-4
    aux_lr: float = 1e-3
    clip_norm: float = 1.0
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    eval_every: int = 1000
    eval_images: int = 4
    checkpoint_every: int = 1000
    seed: int = 0
    device: str = None
    workers: int = 2
    prefetch: int = 4
    small_images: str = "pad"
    quiet: bool = False
    precision: str = "fp32"
    graph: bool = True
    flip: str = "horizontal"
    scale_range: tuple = (1.0, 1.0)
    init: str = None

    #: Fields a resumed run must share with its checkpoint: they decide the
    #: data, the noise and the shapes, so a change would not continue the run.
    RUN_DEFINING = ("seed", "batch_size", "crop", "model", "N", "M", "flip", "scale_range")
    #: Run-defining fields added after checkpoints were first written: a checkpoint
    #: without them was trained with their defaults (what gdnflow did before).
    ADDED_LATER = ("flip", "scale_range")

    def __post_init__(self):
        if isinstance(self.scale_range, list):      # as JSON (a checkpoint) gives it back
            self.scale_range = tuple(self.scale_range)

    @property
    def augmentation(self):
        """The :class:`~gdnflow.data.augment.Augmentation` of the training crops."""
        return Augmentation(self.flip, self.scale_range)

    def differences(self, saved):
        """The run-defining fields in which ``saved`` (a checkpoint's ``train_config``)
        differs from this config: a list of "name: checkpoint X, now Y".

        Fields in ADDED_LATER that ``saved`` lacks count as their defaults; other
        missing fields are not compared.
        """
        defaults = TrainConfig()
        saved = {**{name: getattr(defaults, name) for name in self.ADDED_LATER}, **saved}
        found = []
        for name in self.RUN_DEFINING:
            if name not in saved:
                continue
            then, now = saved[name], getattr(self, name)
            if (tuple(then) if isinstance(then, list) else then) != now:
                found.append(f"{name}: checkpoint {then!r}, now {now!r}")
        return found

    def check(self):
        """Raise ValueError naming the first field out of range."""
        for name in ("steps", "batch_size", "crop", "N", "M", "prefetch"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        for name in ("eval_every", "checkpoint_every", "warmup_steps", "eval_images", "workers"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.model not in CODEC_MODELS:
            raise ValueError(f"model must be one of {sorted(CODEC_MODELS)}, got {self.model!r}")
        if self.crop % CODEC_MODELS[self.model].downsampling:
            raise ValueError(f"crop must be a multiple of {CODEC_MODELS[self.model].downsampling} "
                             f"for the {self.model} model, got {self.crop}")
        if not (self.lmbda >= 0 and self.lr > 0 and self.aux_lr > 0 and self.clip_norm > 0):
            raise ValueError("lmbda must be >= 0 and lr, aux_lr and clip_norm > 0")
        if self.lr_schedule not in ("constant", "cosine"):
            raise ValueError(f"lr_schedule must be 'constant' or 'cosine', got {self.lr_schedule!r}")
        if self.device is not None:
            check_device(self.device)
        if self.precision not in TRAIN_PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(TRAIN_PRECISIONS)}, got "
                             f"{self.precision!r}")
        self.augmentation       # raises ValueError naming flip or scale_range

    @property
    def matmul_precision(self):
        """The ``settings.matmul_precision`` of the run's steps and evaluations: "tf32" for
        ``precision="tf32"``, else "fp32"."""
        return "tf32" if self.precision == "tf32" else "fp32"

    @property
    def autocast_dtype(self):
        """The dtype of the steps' ``gdnflow.autocast``, or None (float32 steps)."""
        return self.precision if self.precision in ("bf16", "fp16") else None


__all__ = ["TrainConfig", "TRAIN_PRECISIONS"]
