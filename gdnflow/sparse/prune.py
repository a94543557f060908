"""Magnitude pruning of convolution weights, with masks that keep pruned weights at zero.

    from gdnflow import sparse
    sparse.prune(model, 0.9)                  # one threshold over every prunable conv
    sparse.prune(model, 0.9, per_layer=True)  # 90% of each layer's weights
    for batch in data:                        # fine-tuning
        loss = ...; loss.backward()
        optimizer.step()
        sparse.apply_masks(model)             # after EVERY step: pruned weights back to 0

Prunable layers are the :class:`~gdnflow.nn.conv.Conv2d` modules with
``groups == 1`` (depthwise and grouped convolutions have few weights and no
sparse kernel). Each pruned layer gets a buffer ``weight_mask`` (1 keeps a
weight, 0 prunes it, same shape and device as the weight), so it is saved
in checkpoints (``/buffers/<layer>.weight_mask``) and moved by ``to()``.

Why a call after the step rather than a gradient hook: the optimiser's
momentum and weight decay move a zero weight even when its gradient is
masked, so the only place that guarantees zeros is after the update.
:func:`apply_masks` multiplies in place (one kernel per layer on the GPU),
so the optimiser's parameter tables stay valid.
"""
import numpy as np

from gdnflow.backends import cuda
from gdnflow.nn.conv import Conv2d
from gdnflow.tensor import weights_changed
from gdnflow.tensor import Tensor

MASK = "weight_mask"


def prunable_layers(module):
    """(dotted name, layer) of every Conv2d with groups == 1 in ``module``, in order."""
    return [(name.rstrip("."), m) for name, m in module.named_modules()
            if isinstance(m, Conv2d) and m.groups == 1]


def _check_sparsity(sparsity):
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)) \
            or not 0.0 <= sparsity < 1.0:
        raise ValueError(f"prune: sparsity must be a number in [0, 1), got {sparsity!r}")
    return float(sparsity)


def _smallest(magnitudes, count):
    """A boolean array marking ``count`` entries of the smallest magnitude (exactly count)."""
    pruned = np.zeros(magnitudes.size, bool)
    if count > 0:
        pruned[np.argpartition(magnitudes, count - 1)[:count]] = True
    return pruned


def prune(module, sparsity, per_layer=False):
    """Zero the smallest-magnitude conv weights of ``module`` and keep masks; returns a report.

    ``sparsity`` in [0, 1) is the fraction of weights set to zero: of all
    prunable weights together (one global magnitude threshold, so layers
    end up with different sparsities) or, with ``per_layer``, of each
    layer's own. Exactly round(sparsity * count) weights are selected (ties
    at the threshold are broken arbitrarily). A weight a mask already prunes
    stays pruned (the new mask is the old one AND the new selection), so
    re-pruning never lets a pruned weight grow back; the result is then at
    least the requested sparsity.

    A global threshold over layers whose weights differ in scale (an
    untrained network, whose initial scale is 1/sqrt(fan_in)) can prune a
    whole layer; check the report, or prune per layer.

    Returns {layer name: fraction of its weights now zero}. Raises
    ValueError if the module has no prunable layer.
    """
    sparsity = _check_sparsity(sparsity)
    layers = prunable_layers(module)
    if not layers:
        raise ValueError(f"prune: {type(module).__name__} has no Conv2d with groups == 1")
    weights = [layer.weight.numpy() for _, layer in layers]
    if per_layer:
        masks = [~_smallest(np.abs(w).ravel(), int(round(sparsity * w.size))).reshape(w.shape)
                 for w in weights]
    else:
        magnitudes = np.concatenate([np.abs(w).ravel() for w in weights])
        keep = ~_smallest(magnitudes, int(round(sparsity * magnitudes.size)))
        splits = np.cumsum([w.size for w in weights])[:-1]
        masks = [k.reshape(w.shape) for k, w in zip(np.split(keep, splits), weights)]
    report = {}
    for (name, layer), w, keep in zip(layers, weights, masks):
        old = layer._buffers.get(MASK)
        if old is not None:
            keep = keep & (old.numpy() != 0)
        set_mask(layer, keep)
        report[name] = 1.0 - float(keep.mean())
    apply_masks(module)
    return report


def set_mask(layer, keep):
    """Give ``layer`` the mask ``keep`` (bool or 0/1 array of the weight's shape) as its buffer."""
    weight = layer.weight
    keep = np.asarray(keep)
    if keep.shape != weight.shape:
        raise ValueError(f"set_mask: mask shape {keep.shape} differs from the weight's "
                         f"{weight.shape}")
    mask = Tensor(keep.astype(np.float64), device=weight.device, dtype=weight.dtype)
    if MASK in layer._buffers:
        setattr(layer, MASK, mask)
    else:
        layer.register_buffer(MASK, mask)


def apply_masks(module):
    """``weight *= weight_mask``, in place, for every layer of ``module`` that has a mask.

    Call it after every optimiser step while fine-tuning a pruned model (see
    the module docstring); also after loading weights from elsewhere.
    """
    changed = False
    for _, m in module.named_modules():
        mask = m._buffers.get(MASK)
        weight = m._parameters.get("weight")
        if mask is None or weight is None:
            continue
        if weight.device == "numpy":
            weight.data *= mask.data.astype(weight.data.dtype, copy=False)
        elif weight.size:
            cuda.kernel("sparse_conv.cu", "multiply_in_place", "PPi").launch(
                weight.size, weight.data.ptr, mask.data.ptr, weight.size)
        changed = True
    if changed:
        weights_changed()


def sparsity_report(module):
    """{layer name: (zero weights, weights, has a mask)} for every prunable layer."""
    report = {}
    for name, layer in prunable_layers(module):
        w = layer.weight.numpy()
        report[name] = (int(w.size - np.count_nonzero(w)), int(w.size),
                        layer._buffers.get(MASK) is not None)
    return report


def add_mask_slots(module, names):
    """Register all-ones masks on the layers ``names`` (dotted, as in a checkpoint's buffers).

    What loading a pruned checkpoint into a freshly built model needs first:
    the model's buffers must match the file's names before the values load.
    """
    layers = {n.rstrip("."): m for n, m in module.named_modules()}
    for name in names:
        layer = layers.get(name) if name else module
        if layer is None or "weight" not in layer._parameters:
            raise KeyError(f"add_mask_slots: the model has no layer {name!r} with a weight")
        if layer._buffers.get(MASK) is None:
            set_mask(layer, np.ones(layer.weight.shape, bool))
