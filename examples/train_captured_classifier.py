"""Train your own model and loss through a compiled step (``gdnflow.compile_step``).

    python examples/train_captured_classifier.py
    python examples/train_captured_classifier.py --device numpy --steps 150 --batch-size 16

A small CNN learns to tell horizontal, vertical and diagonal stripes apart
in noisy 16x16 images that the script draws itself (seeded); the defaults
take a few seconds on NumPy. The training step (forward, loss, backward,
clipping, Adam) is one function given to ``gdnflow.compile_step``: on the
GPU it is captured once as a CUDA graph and replayed every step without
running its Python again; on NumPy it runs eagerly, with the same rules.
The loop reads nothing back except every ``--log-every`` steps (the loss,
and the flag that says whether a step went NaN), and ends with the accuracy
on held-out images. docs/compiled_step.md explains the contract.
"""
import dataclasses
import sys

import numpy as np

import gdnflow as gf
from gdnflow.commandline import (FAILURE, SUCCESS, CommandParser, nonnegative_int, positive_int,
                                 run)

#: Side of the square images, in pixels.
SIDE = 16
#: Pixels per image: the first PIXELS columns of a packed batch's rows.
PIXELS = SIDE * SIDE
#: The classes, in the order of the one-hot columns.
CLASSES = ("horizontal", "vertical", "diagonal")
#: Standard deviation of the Gaussian noise drawn into every image on the host.
PIXEL_NOISE = 0.6
#: Amplitude of the uniform noise the step adds on the device (augmentation).
DEVICE_NOISE = 0.5
#: Key of the device noise generator (its stream is the step number).
NOISE_KEY = 2024
#: Held-out images for the final accuracy.
EVAL_IMAGES = 600


def stripe_images(rng, count):
    """``count`` noisy stripe images [count, SIDE, SIDE] and their class indices [count].

    Each image is a sine grating of random period (3 to 6 pixels), phase and
    contrast along the rows, the columns or the diagonal, plus Gaussian
    noise of standard deviation :data:`PIXEL_NOISE`.
    """
    labels = rng.integers(0, len(CLASSES), count)
    rows, cols = np.mgrid[0:SIDE, 0:SIDE]
    # Position along each class's direction: horizontal stripes change from row to row.
    along = np.stack([rows, cols, (rows + cols) / np.sqrt(2)])[labels]
    period = rng.uniform(3, 6, (count, 1, 1))
    phase = rng.uniform(0, 2 * np.pi, (count, 1, 1))
    contrast = rng.uniform(0.5, 1.0, (count, 1, 1))
    images = contrast * np.sin(2 * np.pi * along / period + phase)
    images += rng.normal(0, PIXEL_NOISE, images.shape)
    return images.astype(np.float32), labels


def pack_batch(images, labels):
    """One array [N, PIXELS + len(CLASSES)]: each row an image's pixels, then its one-hot label.

    A compiled step takes ONE batch array, copied into the step's static
    input before every call; putting the targets in the same rows brings
    them along in that copy, with nothing read or copied inside the step.
    """
    one_hot = np.eye(len(CLASSES), dtype=np.float32)[labels]
    return np.concatenate([images.reshape(len(images), PIXELS), one_hot], axis=1)


def unpack_batch(batch):
    """The images [N, 1, SIDE, SIDE] and one-hot targets [N, len(CLASSES)] of a packed batch.

    gdnflow operators only: this runs inside the step function.
    """
    images = gf.ops.slice_(batch, (slice(None), slice(0, PIXELS)))
    targets = gf.ops.slice_(batch, (slice(None), slice(PIXELS, None)))
    return images.reshape(batch.shape[0], 1, SIDE, SIDE), targets


def build_model(rng):
    """The classifier: two 3x3 convolutions, max and global-average pooling, a linear head."""
    return gf.nn.Sequential(
        gf.nn.Conv2d(1, 8, 3, padding=1, activation="relu", rng=rng),
        gf.nn.MaxPool2d(2),
        gf.nn.Conv2d(8, 16, 3, padding=1, activation="relu", rng=rng),
        gf.nn.GlobalAvgPool2d(),
        gf.nn.Flatten(),
        gf.nn.Linear(16, len(CLASSES), rng=rng),
    )


def mean_nll(logits, targets):
    """Mean negative log-likelihood of the one-hot ``targets`` under softmax(``logits``)."""
    log_probabilities = gf.ops.log_softmax(logits, axis=1)
    return -(log_probabilities * targets).sum() / logits.shape[0]


def make_train_step(model, optimizer, max_grad_norm):
    """The step function for ``gdnflow.compile_step``: ``train_step(batch, step)``.

    Returns the loss and the gradient norm as one-element device tensors.
    """
    def train_step(batch, step):
        images, targets = unpack_batch(batch)
        # Noise drawn on the device, from the step's counter: a plain int
        # would be frozen into the captured graph (uniform_noise refuses it),
        # step.index gives every replay its own noise. uniform_noise adds
        # U(-1/2, 1/2); the scaling around it sets the amplitude.
        noisy = gf.ops.uniform_noise(images * (1 / DEVICE_NOISE), NOISE_KEY,
                                     step.index) * DEVICE_NOISE
        loss = mean_nll(model(noisy), targets).reshape(1)
        optimizer.zero_grad()
        loss.backward()
        # sync=False: the norm stays on the device (a float would need a read back).
        norm = gf.optim.clip_grad_norm(model.parameters(), max_grad_norm, sync=False)
        # A NaN or infinity sets the step's flag: this and every later update is skipped.
        step.guard_finite(loss, norm)
        optimizer.step()
        return {"loss": loss, "grad_norm": norm}
    return train_step


def accuracy(model, images, labels, device):
    """The fraction of ``images`` that ``model`` classifies as ``labels`` (an eager forward)."""
    model.eval()
    with gf.no_grad():
        logits = model(gf.tensor(images[:, None], device=device)).numpy()
    model.train()
    return float(np.mean(logits.argmax(axis=1) == labels))


@dataclasses.dataclass
class TrainingResult:
    """What a run gives: the losses read back ``[(step number, loss)]``, the held-out
    accuracy, the first non-finite step (None if none) and the steps run."""

    losses: list
    accuracy: float
    first_nonfinite_step: int = None
    steps: int = 0


def train(device=None, steps=300, batch_size=32, seed=0, lr=3e-3, max_grad_norm=1.0,
          log_every=50, graph=True, log=print):
    """Train the classifier through a compiled step; returns a :class:`TrainingResult`.

    ``device``: "numpy", "cuda" or None (gdnflow's default). ``graph=False``
    runs every step eagerly (the same function, no CUDA graph). ``log``
    receives the progress lines. Stops early, with the parameters of the
    last good step, if a step's loss or gradient norm is not finite.
    """
    device = device or gf.default_device()
    # Two independent streams: the held-out images are never training images.
    rng, held_out_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    model = build_model(rng).to(device)
    # After the move: the optimiser must see the parameters on their device.
    optimizer = gf.optim.Adam(model.parameters(), lr=lr)
    schedule = gf.optim.CosineLR(optimizer, total_steps=steps, warmup_steps=steps // 10)
    columns = PIXELS + len(CLASSES)
    # The example batch fixes the step's device and dtype (an array would
    # mean the default device).
    compiled = gf.compile_step(make_train_step(model, optimizer, max_grad_norm),
                               gf.zeros((batch_size, columns), device=device), graph=graph)
    losses, bad = [], None
    for _ in range(steps):
        step_lr = schedule.last_lrs[0]
        outputs = compiled(pack_batch(*stripe_images(rng, batch_size)))
        # The learning rate is host state: the schedule changes it between
        # calls and the optimiser writes it to the device before each replay.
        schedule.step()
        if compiled.step % log_every == 0 or compiled.step == steps:
            # The one wait for the GPU per log_every steps. On the GPU the
            # outputs are the graph's own tensors, overwritten by every
            # replay: read them now, not after the next call.
            bad = compiled.first_nonfinite_step()
            if bad is not None:
                log(f"step {bad}: the loss or the gradient norm is not finite; the "
                    f"parameters are those after step {bad - 1}")
                break
            losses.append((compiled.step, outputs["loss"].item()))
            log(f"step {compiled.step:5d}  loss {losses[-1][1]:.4f}  "
                f"grad norm {outputs['grad_norm'].item():.3f}  lr {step_lr:.2e}")
    held_out_images, held_out_labels = stripe_images(held_out_rng, EVAL_IMAGES)
    result = TrainingResult(losses, accuracy(model, held_out_images, held_out_labels, device),
                            bad, compiled.step)
    log(f"held-out accuracy {result.accuracy:.3f} on {EVAL_IMAGES} images "
        f"(chance: {1 / len(CLASSES):.3f})")
    return result


def build_parser():
    """The command-line options (gdnflow's usage-error conventions: CommandParser)."""
    parser = CommandParser(prog="train_captured_classifier.py",
                           description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["numpy", "cuda"],
                        help="where to train (default: gdnflow's default device)")
    parser.add_argument("--steps", type=positive_int, default=300)
    parser.add_argument("--batch-size", type=positive_int, default=32)
    parser.add_argument("--seed", type=nonnegative_int, default=0)
    parser.add_argument("--log-every", type=positive_int, default=50,
                        help="read the loss and the NaN flag back every N steps (default 50)")
    parser.add_argument("--no-graph", dest="graph", action="store_false",
                        help="run every step eagerly instead of replaying a CUDA graph")
    parser.set_defaults(run=_run)
    return parser


def _run(args):
    result = train(args.device, args.steps, args.batch_size, args.seed,
                   log_every=args.log_every, graph=args.graph)
    return FAILURE if result.first_nonfinite_step is not None else SUCCESS


def main(argv=None):
    """Parse the options and train; returns the exit status (1 if a step went non-finite)."""
    return run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
