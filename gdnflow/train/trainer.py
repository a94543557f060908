"""Training a codec model (factorized prior or scale hyperprior) end to end: the loop,
evaluation, checkpoints, resuming, and the stop on NaN or infinity.

One step (``Trainer.train_step``)::

    out = model(x, noise_key, noise_stream=step)         # y + U(-1/2, 1/2) noise
    loss = lambda 255^2 MSE + bpp;   aux = model.aux_loss()
    loss.backward(); aux.backward()
    norm = clip_grad_norm(main parameters, clip_norm)   # the step's one host sync
    stop here with NonFiniteError if loss, bpp, aux or norm is not finite
    main Adam step (every parameter but the quantiles); aux Adam step (the quantiles)

:meth:`Trainer.run` runs the same step through :func:`gdnflow.compile_step`
by default (``graph``): captured once as a CUDA graph and replayed, with
clipping computed on the device, the NaN/inf check a device flag that stops
the updates (seen when the step records are read back: every ``SYNC_EVERY``
steps, the steps the GPU has finished), and the learning rates written before each
replay. Its losses are those of the eager step (tests/train/test_compiled_trainer.py).

As in CompressAI, the main and auxiliary losses have their own Adam (learning
rates 1e-4 and 1e-3); unlike CompressAI's loop, the auxiliary loss is evaluated
before the main update, so that one read back of the step's scalars covers both.

Reproducibility and resuming: every random choice is a function of the
run's seed and the step: the data order and crops (see
:mod:`gdnflow.data.images`) and the quantisation noise (a counter-based
generator keyed by the run, with the step as its stream; see
:func:`gdnflow.ops.entropy.uniform_noise`). A checkpoint stores the
parameters, both optimisers' states, the learning-rate schedule and the
step; a resumed run therefore computes exactly the losses of the
uninterrupted one (bit for bit on NumPy; tests/train/test_trainer.py checks it).

Files in the run folder (``out_dir``): ``checkpoint.h5`` (atomic, see
:mod:`gdnflow.io.checkpoint`), ``history.jsonl`` and ``eval.jsonl`` (one JSON
record per training step / evaluation, written just before each checkpoint),
and at the end ``curves.png`` and ``reconstructions.png``; every file is
replaced atomically. :func:`train` owns the folder for the run
(:mod:`gdnflow.train.run_folder`: ``run.lock``, runs refused or moved
aside); SIGINT and SIGTERM stop between steps (:mod:`gdnflow.train.stopping`).
"""
import contextlib
import dataclasses
import json
import math
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from gdnflow.backends import default_device
from gdnflow.config import override
from gdnflow.data.images import ImageFolder
from gdnflow.data.loader import BackgroundLoader
from gdnflow.io.checkpoint import (load_checkpoint, optimizer_state_from_json,
                                   optimizer_state_to_json, read_checkpoint_info, save_checkpoint)
from gdnflow.io.files import write_bytes_atomic
from gdnflow.models import CODEC_MODELS
from gdnflow.optim import Adam, CosineLR, DynamicLossScaler, clip_grad_norm
from gdnflow.precision import autocast
from gdnflow.tensor import Tensor
from gdnflow.train.evaluation import evaluate_images, mean_of_rows
from gdnflow.train.losses import RateDistortionLoss, describe_evaluation, mse_to_psnr
from gdnflow.train.numerics import NonFiniteError, locate_non_finite
from gdnflow.train.queued import STEP_SCALARS, SYNC_EVERY, QueuedSteps
from gdnflow.train.plots import plot_curves, plot_reconstructions
from gdnflow.train.stopping import RunStopped, StopSignals, signal_name
from gdnflow.train.train_config import TrainConfig

CHECKPOINT_NAME = "checkpoint.h5"


class Trainer:
    """Trains a codec model (``config.model``) by the rate-distortion loss.

    ``Trainer(config)`` builds the model (seeded by ``config.seed``), its two
    Adam optimisers and the data; ``model``, ``train_data`` and ``eval_data``
    (ImageFolders) may be given instead (``eval_images`` 0 evaluates on all). :meth:`run` trains to
    ``config.steps``; :meth:`resume` first loads a checkpoint of the same
    run. :meth:`train_step` does one step on a given batch (the benchmark
    and the tests use it). ``history`` holds one record per step (``step``,
    ``loss``, ``bpp``, ``mse``, ``psnr``, ``aux``, ``grad_norm``),
    ``eval_history`` one per evaluation.
    """

    #: This process's part of each batch, (index, count): a data-parallel rank's
    #: (:mod:`gdnflow.train.distributed_run`), which also writes no files unless rank 0
    #: and agrees on stopping with the other ranks (its ``stop_signals``).
    shard = (0, 1)
    writes_files = True
    stop_signals = StopSignals

    def __init__(self, config=None, model=None, train_data=None, eval_data=None):
        self.config = config = config or TrainConfig()
        config.check()
        self.device = config.device or default_device()
        if model is not None and getattr(model, "name", None) != config.model:
            raise ValueError(f"Trainer: a {type(model).__name__} given for model={config.model!r}")
        self.model = model if model is not None else CODEC_MODELS[config.model](
            config.N, config.M, seed=config.seed, device=self.device)
        if config.init is not None:
            self.load_initial_weights(config.init)
        # Optimisers hold Parameter objects: build them after the move.
        self.model.to(self.device)
        self.model.train()
        self.main_parameters = self.model.main_parameters()
        self.optimizer = Adam(self.main_parameters, lr=config.lr)
        self.aux_optimizer = Adam(self.model.aux_parameters(), lr=config.aux_lr)
        self.schedule = (CosineLR(self.optimizer, total_steps=config.steps,
                                  warmup_steps=config.warmup_steps)
                         if config.lr_schedule == "cosine" else None)
        self.criterion = RateDistortionLoss(config.lmbda)
        #: fp16 steps' loss scaler (None otherwise): a step whose gradients overflow
        #: is skipped and the scale lowered (its record says ``skipped``).
        self.loss_scaler = DynamicLossScaler() if config.precision == "fp16" else None
        # The noise generator's key: fixed by the seed; its stream is the step.
        self.noise_key = int(np.random.default_rng([config.seed, 2]).integers(2 ** 63))
        self._train_data, self._eval_data = train_data, eval_data
        self.step = 0
        self.history, self.eval_history = [], []
        self._logged = {"history": 0, "eval": 0}
        self._saved = (None, None)      # (step, path) of the last checkpoint written or loaded
        self.last_reconstructions = []
        self._queued = QueuedSteps(self.step_function, self.device, self.notify)

    def load_initial_weights(self, path):
        """Load the parameters and buffers of the checkpoint at ``path`` into the model.

        The start of a fine-tuning run (``config.init``): only the weights are
        taken; the optimisers, schedule and step are this run's. Raises
        ValueError if the checkpoint holds another model, and CheckpointError
        (naming the file) if it cannot be read or its shapes differ (another N, M).
        """
        held = read_checkpoint_info(path)["model_name"]
        if held != self.config.model:
            raise ValueError(f"--init {path} holds a {held} model, this run trains "
                             f"{self.config.model} (--model)")
        load_checkpoint(path, self.model)

    # ------------------------------------------------------------ data --
    @property
    def train_data(self):
        """The training ImageFolder (built from ``config.data`` on first use)."""
        if self._train_data is None:
            self._train_data = ImageFolder(self.config.data, crop=self.config.crop,
                                           small=self.config.small_images)
        return self._train_data

    @property
    def eval_data(self):
        """The evaluation ImageFolder: ``config.eval_data``, else the training images."""
        if self._eval_data is None:
            self._eval_data = (ImageFolder(self.config.eval_data, crop=self.model.downsampling)
                               if self.config.eval_data else self.train_data)
        return self._eval_data

    @property
    def out_dir(self):
        """The run folder (created on first write)."""
        return Path(self.config.out_dir)

    # ------------------------------------------------------------ step --
    def train_step(self, batch):
        """One optimisation step on ``batch`` (N, 3, H, W) in [0, 1]: an array or a Tensor.

        The eager step: it reads the step's values back before updating.
        Returns the step's record (also appended to ``history``). Raises
        :class:`NonFiniteError` before updating anything if the loss, the
        rate, the auxiliary loss or the gradient norm is not finite. The
        matrix products run in ``config.precision``.
        """
        with override(matmul_precision=self.config.matmul_precision):
            return self._train_step(batch)

    def _train_step(self, batch):
        x = batch if isinstance(batch, Tensor) else Tensor(batch, device=self.device)
        self.flush()            # queued steps first: the history stays in step order
        step = self.step
        self.model.train()
        terms, aux = self._forward_backward(x, step)
        scaler = self.loss_scaler
        if scaler is not None:
            scaler.unscale(self.main_parameters)
        norm = clip_grad_norm(self.main_parameters, self.config.clip_norm)
        record = {"step": step + 1, **{k: terms[k].item() for k in ("loss", "bpp", "mse")},
                  "aux": aux.item(), "grad_norm": norm}
        # With loss scaling, overflowing gradients skip the step; non-finite values stop it.
        checked = STEP_SCALARS if scaler is None else [k for k in STEP_SCALARS if k != "grad_norm"]
        if not all(math.isfinite(record[k]) for k in checked):
            self._stop_non_finite(x, record)
        if scaler is None:
            self.optimizer.step()
        else:
            record["loss_scale"] = scaler.scale_value
            record["skipped"] = not scaler.step(self.optimizer)
        self.aux_optimizer.step()
        self._finish_step(record)
        return record

    def _forward_backward(self, x, noise_stream):
        """Forward, loss and both backwards of one step: (loss terms, auxiliary loss)."""
        dtype = self.config.autocast_dtype
        with autocast(dtype or "bf16", enabled=dtype is not None):
            out = self.model(x, noise_key=self.noise_key, noise_stream=noise_stream)
            terms = self.criterion(out, x)
        self.optimizer.zero_grad()
        self.aux_optimizer.zero_grad()
        loss = terms["loss"]
        (loss if self.loss_scaler is None else self.loss_scaler.scale(loss)).backward()
        aux = self.model.aux_loss()
        with self.local_gradients():
            aux.backward()
        return terms, aux

    def local_gradients(self):
        """The block of the auxiliary backward: its loss depends on the parameters alone, the
        same in every data-parallel process, so its gradients need no averaging."""
        return contextlib.nullcontext()

    def _finish_step(self, record):
        if self.schedule is not None:
            self.schedule.step()
        self.step += 1
        if record is not None:
            record["psnr"] = mse_to_psnr(record["mse"])
            self.history.append(record)

    # --------------------------------------------------- compiled step --
    def step_function(self, x, step):
        """The training step as a function for :func:`gdnflow.compile_step`: ``(batch, step)``.

        The eager step's work, with nothing read back: the gradient norm is
        clipped on the device, and the loss terms, auxiliary loss and norm are
        guarded (``step.guard_finite``), so that a NaN or infinity stops
        every later update on the device. Returns the step's scalars
        (``STEP_SCALARS``) as one-element tensors.
        """
        self.model.train()
        terms, aux = self._forward_backward(x, step.index)
        norm = clip_grad_norm(self.main_parameters, self.config.clip_norm, sync=False)
        scalars = {**{k: terms[k].reshape(1) for k in ("loss", "bpp", "mse")},
                   "aux": aux.reshape(1), "grad_norm": norm}
        step.guard_finite(*scalars.values())
        self.optimizer.step()
        self.aux_optimizer.step()
        return scalars

    def queue_step(self, batch):
        """One step through the compiled step (made on first use), read back later.

        The step's record is appended to ``history`` by :meth:`flush`, which
        runs every ``SYNC_EVERY`` steps (taking the steps the GPU finished),
        before a checkpoint or an evaluation and at the end of :meth:`run`
        (taking all); a NaN or infinity raises
        :class:`NonFiniteError` there, naming the first bad step, with the
        parameters as they were before it. The matrix products run in
        ``config.precision``.
        """
        with override(matmul_precision=self.config.matmul_precision):
            self._queued.run(batch, self.step)
        self._finish_step(None)
        if len(self._queued) >= SYNC_EVERY:
            self.flush(wait=False)

    def flush(self, wait=True):
        """Read back the queued steps' records into ``history``.

        ``wait=True`` waits for every queued step; ``wait=False`` takes only
        the steps the GPU has finished (the periodic read of :meth:`queue_step`,
        which never stops the GPU's queue).

        Raises :class:`NonFiniteError` if the compiled step's flag says a step
        went non-finite: the records before it are kept, the step count goes
        back to the step before it, and that step is run again eagerly to
        find where the NaN or infinity came from.
        """
        records, bad = self._queued.read(wait)
        for label, values in records:
            if bad is not None and label >= bad:
                break
            self.history.append({"step": label, **values, "psnr": mse_to_psnr(values["mse"])})
        if bad is not None:
            self._stop_compiled_non_finite(bad, dict(records).get(bad))

    def _stop_compiled_non_finite(self, bad, values):
        """The compiled step's flag named step ``bad``: find the cause eagerly and raise.

        Every update from step ``bad`` on was skipped on the device, so the
        parameters are those before it. The step count, the schedule and the
        optimisers' step counts go back there too; that step's batch is then
        run again eagerly to name the layer or parameter.
        """
        batch = self._queued.batch_of(bad)
        skipped = self.step - bad + 1
        self._queued.discard()
        self.step = bad - 1
        if self.schedule is not None:
            self.schedule.load_state_dict({**self.schedule.state_dict(), "last_step": self.step})
        for state in [*self.optimizer.state.values(), *self.aux_optimizer.state.values()]:
            if "step" in state:
                state["step"] -= skipped
        record = {**dict.fromkeys(STEP_SCALARS, float("nan")), **(values or {})}
        try:
            if batch is None:
                batch = self.make_batch(self.step)
            x = batch if isinstance(batch, Tensor) else Tensor(batch, device=self.device)
            with override(matmul_precision=self.config.matmul_precision):
                self._forward_backward(x, self.step)
        except Exception as exc:        # the report of the NaN must not be lost to this
            raise NonFiniteError(
                f"training stopped at step {bad}: non-finite values; rerunning the step to find "
                f"where failed ({type(exc).__name__}: {exc}). No parameter was updated since "
                f"step {bad - 1}; the last checkpoint is intact.", step=bad) from exc
        self._stop_non_finite(x, record)

    def notify(self, message):
        """Say something about the run (a compiled step's notices) above the progress bar."""
        tqdm.write(message)

    def _stop_non_finite(self, x, record):
        """Find the first parameter, layer output or gradient that is not finite; raise."""
        step = self.step
        values = ", ".join(f"{k} {record[k]:.4g}" for k in ("loss", "bpp", "aux", "grad_norm"))
        where, what = locate_non_finite(self.model, x, record, noise_key=self.noise_key,
                                        noise_stream=step)
        raise NonFiniteError(
            f"training stopped at step {step + 1}: non-finite values ({values}); {what}. "
            "No parameter was updated; the last checkpoint is intact.", step=step + 1, where=where)

    # -------------------------------------------------------- evaluate --
    def evaluate(self, limit=None, keep=0):
        """Rate, distortion and loss on the evaluation images at full size (eval mode).

        Each image is padded (reflect) to multiples of 16, coded with
        rounding, and measured against the original: bpp counts the padded
        latent's bits over the original pixels. Returns the mean ``loss``,
        ``bpp``, ``mse``, ``psnr`` and ``ms_ssim`` (NaN for images too small
        for five scales) and records it in ``eval_history``. ``keep``
        reconstructions are kept in ``last_reconstructions`` as
        (name, original, reconstruction, bpp, psnr). The matrix products run
        in ``config.precision``.
        """
        with override(matmul_precision=self.config.matmul_precision):
            return self._evaluate(limit, keep)

    def _evaluate(self, limit, keep):
        limit = self.config.eval_images if limit is None else limit
        rows, kept = evaluate_images(self.model, self.eval_data.evaluation_images(limit or None),
                                     self.config.lmbda, self.device, keep)
        if not rows:
            return {}
        result = {"step": self.step, "images": len(rows), **mean_of_rows(rows)}
        self.eval_history.append(result)
        if keep:
            self.last_reconstructions = kept
        return result

    # ----------------------------------------------------- checkpoints --
    def checkpoint_path(self):
        """Where this run's checkpoint is written."""
        return self.out_dir / CHECKPOINT_NAME

    def save(self, path=None):
        """Write the new history records, then the checkpoint (atomically); returns the path.

        The records go first: a process killed between the two leaves records
        past the last checkpoint, which :meth:`resume` drops, never a
        checkpoint whose records are missing.
        """
        path = Path(path) if path is not None else self.checkpoint_path()
        self.flush()
        self._saved = (self.step, path)
        if not self.writes_files:
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._append_logs()
        extra = {
            "step": self.step,
            "noise_key": self.noise_key,
            "train_config": dataclasses.asdict(self.config),
            "aux_optimizer": optimizer_state_to_json(self.aux_optimizer),
            "schedule": self.schedule.state_dict() if self.schedule is not None else None,
            "loss_scaler": (self.loss_scaler.state_dict() if self.loss_scaler is not None
                            else None),
            # The data's size decides the epochs' permutations: resume checks it.
            "images": len(self._train_data) if self._train_data is not None else None,
        }
        save_checkpoint(path, self.model, self.optimizer, extra)
        return path

    def resume(self, path=None):
        """Load a checkpoint of this run: parameters, optimisers, schedule, step, history.

        Raises ValueError if the checkpoint's seed, batch size, crop, model,
        model size, flips or scale range differ from this run's (it would not
        continue the same run; see ``TrainConfig.RUN_DEFINING``).
        """
        path = Path(path) if path is not None else self.checkpoint_path()
        self._queued.discard()          # steps queued before the resume are not this run's
        info = read_checkpoint_info(path)
        extra = info["extra"]
        # Checkpoints from before the model choice record the model only as model_name.
        differing = self.config.differences({"model": info["model_name"],
                                             **extra.get("train_config", {})})
        if differing:
            raise ValueError(f"cannot resume from {path}: it belongs to another run ("
                             + "; ".join(differing) + ")")
        if extra.get("images") is not None and extra["images"] != len(self.train_data):
            raise ValueError(f"cannot resume from {path}: it was trained on {extra['images']} "
                             f"images, the data now has {len(self.train_data)}")
        load_checkpoint(path, self.model, self.optimizer)
        # The weights it started from stay on record in the resumed run's checkpoints.
        self.config.init = extra.get("train_config", {}).get("init")
        self.aux_optimizer.load_state_dict(optimizer_state_from_json(extra["aux_optimizer"]))
        if self.schedule is not None and extra.get("schedule"):
            self.schedule.load_state_dict(extra["schedule"])
        if self.loss_scaler is not None and extra.get("loss_scaler"):
            self.loss_scaler.load_state_dict(extra["loss_scaler"])
        self.step = int(extra["step"])
        self.noise_key = int(extra["noise_key"])
        self.history = [r for r in self._read_log("history") if r["step"] <= self.step]
        self.eval_history = [r for r in self._read_log("eval") if r["step"] <= self.step]
        # Records past the checkpoint (a run that died after it) are dropped from
        # the files too, each rewritten atomically.
        for kind, records in (("history", self.history), ("eval", self.eval_history)):
            text = "".join(json.dumps(r) + "\n" for r in records)
            if self.writes_files:
                write_bytes_atomic(self.out_dir / f"{kind}.jsonl", text.encode(), overwrite=True)
            self._logged[kind] = len(records)
        self._saved = (self.step, path)
        return self.step

    def _read_log(self, kind):
        log = self.out_dir / f"{kind}.jsonl"
        if not log.exists():
            return []
        records = []
        with open(log) as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    break               # a line cut short by a crash: the rest is gone too
        return records

    def _append_logs(self):
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for kind, records in (("history", self.history), ("eval", self.eval_history)):
            new = records[self._logged[kind]:]
            if new:
                with open(self.out_dir / f"{kind}.jsonl", "a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in new)
                self._logged[kind] = len(records)

    # ------------------------------------------------------------- run --
    def batches(self):
        """A BackgroundLoader of the training batches from the current step to ``config.steps``."""
        config = self.config
        self.train_data         # built here, not in the loader's thread
        return BackgroundLoader(self.make_batch, start=self.step, stop=config.steps,
                                prefetch=config.prefetch, workers=config.workers)

    def make_batch(self, step, pool=None):
        """The training batch of ``step`` (this process's ``shard`` of it); ``pool`` decodes."""
        config = self.config
        return self.train_data.batch(config.seed, step, config.batch_size, pool, self.shard,
                                     config.augmentation)

    def run(self):
        """Train from the current step to ``config.steps``; returns the last evaluation.

        Evaluates every ``eval_every`` steps and checkpoints every
        ``checkpoint_every`` steps and at the end; draws ``curves.png`` and
        ``reconstructions.png`` at the end. SIGINT (Ctrl-C) or SIGTERM ends
        the current step, saves a checkpoint of it and raises
        :class:`~gdnflow.train.stopping.RunStopped` (see that module).
        """
        config = self.config
        self.train_data         # built (and its notices printed) before the progress bar
        if self.step >= config.steps:
            print(f"nothing to do: the run is at step {self.step} of {config.steps}")
        bar = tqdm(total=config.steps, initial=self.step, disable=config.quiet,
                   desc=f"{self.model.name} on {self.device}", dynamic_ncols=True)
        started, first = time.perf_counter(), self.step
        with self.stop_signals(defer=True) as stop:
            try:
                with self.batches() as batches:
                    for batch in batches:
                        self._loop_step(batch, bar, stop)
                        if stop.requested:
                            break
            finally:
                bar.close()
            self.flush()
            if stop.requested:
                self._stop_saved(stop)
            result = self.evaluate(keep=4)
            if stop.requested:
                self._stop_saved(stop)
            if result:
                print(describe_evaluation(result))
            with stop.protect():
                path = self.save()
            if self.step > first:
                seconds = time.perf_counter() - started
                print(f"{self.step - first} steps in {seconds:.1f} s "
                      f"({(self.step - first) / seconds:.2f} steps/s); checkpoint {path}")
            with stop.protect():
                self.draw()
        return result

    def _loop_step(self, batch, bar, stop):
        """One step of :meth:`run`: train, show progress, evaluate and checkpoint when due."""
        config = self.config
        if config.graph and self.loss_scaler is None:     # fp16's scaler reads every step back
            self.queue_step(batch)
        else:
            self.train_step(batch)
        bar.update(1)
        if (self.step % SYNC_EVERY == 0 or self.step == config.steps) and self.history:
            record = self.history[-1]       # the latest step read back
            bar.set_postfix(loss=f"{record['loss']:.4f}", bpp=f"{record['bpp']:.3f}",
                            psnr=f"{record['psnr']:.2f}")
        if config.eval_every and self.step % config.eval_every == 0 and self.step < config.steps:
            self.flush()
            bar.write(describe_evaluation(self.evaluate()))
        if config.checkpoint_every and self.step % config.checkpoint_every == 0 \
                and self.step < config.steps:
            with stop.protect():
                self.save()

    def _stop_saved(self, stop):
        """Save the last finished step (unless saved already) and raise RunStopped."""
        name = signal_name(stop.signal)
        saved_step, path = self._saved
        if self.step != saved_step:
            with stop.protect():
                path = self.save()
            saved = f"checkpoint {path} saved"
        elif path is not None:
            saved = f"checkpoint {path} is up to date"
        else:
            raise RunStopped(stop.signal, f"stopped by {name} before the first step: "
                             "nothing to save")
        raise RunStopped(stop.signal, f"stopped by {name} at step {self.step} of "
                         f"{self.config.steps}: {saved}; --resume continues the run")

    def draw(self):
        """Write ``curves.png`` and (after an evaluation) ``reconstructions.png``; returns the paths."""
        if not self.writes_files:
            return []
        self.out_dir.mkdir(parents=True, exist_ok=True)
        paths = [plot_curves(self.history, self.eval_history, self.out_dir / "curves.png")]
        if self.last_reconstructions:
            paths.append(plot_reconstructions(self.last_reconstructions,
                                              self.out_dir / "reconstructions.png"))
        return paths


__all__ = ["TrainConfig", "Trainer", "NonFiniteError", "CHECKPOINT_NAME"]
