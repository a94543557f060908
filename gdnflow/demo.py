"""The main job of this release: fit a model by gradient descent on the
default device, with a progress bar, and report the loss before and after.

The model is logistic regression over 64 features on a synthetic data set
(labels from a hidden linear rule), written with gdnflow operators only: it
exercises the autograd graph, broadcasting, reductions and the elementwise
kernels on whichever backend is active. It is replaced by autoencoder
training once the convolution and GDN operators are in.
"""
import numpy as np

import gdnflow as gf


def make_data(rng, samples=4096, features=64):
    """Points and 0/1 labels from a hidden linear rule with 5% label noise."""
    x = rng.standard_normal((samples, features)).astype(np.float32)
    hidden = rng.standard_normal(features)
    labels = (x @ hidden > 0).astype(np.float32)
    flip = rng.random(samples) < 0.05
    labels[flip] = 1 - labels[flip]
    return x, labels.reshape(-1, 1)


def binary_cross_entropy(p, labels):
    """Mean of -(y log p + (1 - y) log(1 - p)), with p kept off 0 and 1."""
    p = gf.ops.clamp(p, 1e-6, 1 - 1e-6)
    return -(labels * p.log() + (1 - labels) * (1 - p).log()).mean()


def main(steps=200, device=None, seed=0, learning_rate=0.5, quiet=False):
    """Train and print the loss and accuracy; returns 0 on success."""
    from tqdm import tqdm
    device = device or gf.default_device()
    rng = np.random.default_rng(seed)
    x_np, y_np = make_data(rng)
    x = gf.tensor(x_np, device=device)
    y = gf.tensor(y_np, device=device)
    w = gf.tensor(np.zeros((1, x_np.shape[1])), device=device, requires_grad=True)
    b = gf.tensor(np.zeros((1, 1)), device=device, requires_grad=True)

    def loss_and_accuracy():
        p = ((x * w).sum(axis=1, keepdims=True) + b).sigmoid()
        accuracy = float(np.mean((p.numpy() > 0.5) == (y_np > 0.5)))
        return binary_cross_entropy(p, y), accuracy

    with gf.no_grad():
        first, first_acc = loss_and_accuracy()
    bar = tqdm(range(steps), desc=f"logistic regression on {device}", disable=quiet)
    for step in bar:
        loss, accuracy = loss_and_accuracy()
        w.grad = b.grad = None
        loss.backward()
        with gf.no_grad():
            w = (w - learning_rate * w.grad).detach()
            b = (b - learning_rate * b.grad).detach()
        w.requires_grad = b.requires_grad = True
        if step % 10 == 0:
            bar.set_postfix(loss=f"{loss.item():.4f}", accuracy=f"{accuracy:.3f}")
    with gf.no_grad():
        last, last_acc = loss_and_accuracy()
    print(f"device {device}: loss {first.item():.4f} -> {last.item():.4f}, "
          f"accuracy {first_acc:.3f} -> {last_acc:.3f} after {steps} steps")
    return 0 if last.item() < first.item() else 1
