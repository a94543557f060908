"""Pruned models in checkpoints.

A pruned model is saved like any other (:func:`gdnflow.io.save_checkpoint`):
its dense weights, with zeros where pruned, and each pruned layer's mask as
the buffer ``<layer>.weight_mask``. The masks, not CSR arrays, are stored:
the CSR offsets depend on the input size a layer will see, so they are
derived at run time (and cached), while the mask is what fine-tuning needs
too. A freshly built model has no mask buffers, so loading goes through
:func:`load_pruned`, which adds them first.
"""
import inspect

from gdnflow import models
from gdnflow.io.checkpoint import load_checkpoint, read_checkpoint_info
from gdnflow.sparse.prune import MASK, add_mask_slots


def build_model(info, device=None):
    """A model of the kind a checkpoint holds (from ``read_checkpoint_info``), random weights.

    The constructor is ``gdnflow.models.get(config["name"])`` (else the
    lower-cased model name), called with the config's entries it accepts.
    """
    config = dict(info.get("config") or {})
    name = config.pop("name", None) or info["model_name"].lower()
    constructor = models.get(name)
    accepted = inspect.signature(constructor).parameters
    kwargs = {k: v for k, v in config.items() if k in accepted}
    if "device" in accepted and device is not None:
        kwargs["device"] = device
    return constructor(**kwargs)


def mask_layers(info):
    """Dotted names of the layers whose mask a checkpoint holds."""
    suffix = "." + MASK
    names = []
    for name in info["buffer_shapes"]:
        if name == MASK:
            names.append("")
        elif name.endswith(suffix):
            names.append(name[:-len(suffix)])
    return names


def load_pruned(path, model=None, device=None):
    """(model, checkpoint dict) with the checkpoint at ``path`` loaded, masks included.

    ``model`` defaults to a new one built from the file (:func:`build_model`)
    on ``device``. Mask buffers the file has are registered on the model's
    layers before loading, so pruned and unpruned checkpoints both load.
    """
    info = read_checkpoint_info(path)
    if model is None:
        model = build_model(info, device)
    add_mask_slots(model, mask_layers(info))
    checkpoint = load_checkpoint(path, model)
    return model, checkpoint
