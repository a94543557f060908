"""A Keras file's weights, read once and handed out per layer in gdnflow's layout.

Keras keeps NHWC kernels; gdnflow NCHW. :func:`to_gdnflow` converts one
layer's variables: Conv2D [kh, kw, in, out] -> [out, in, kh, kw];
DepthwiseConv2D [kh, kw, in, mult] -> [in*mult, 1, kh, kw] (Keras' output
channel c*mult + m is gdnflow's group c, member m); Dense [in, out] ->
[out, in]; BatchNormalization's gamma, beta, moving mean and variance ->
weight, bias, running_mean, running_var.

The weight sources (:class:`LegacyWeights`, :class:`FlatWeights`,
:class:`StateWeights`) share one interface: ``layer(name, class_name,
config)`` gives {parameter name: array} in gdnflow's layout and
``nested(name)`` the source of a nested model's layers.
"""
import re

import numpy as np

from gdnflow.io.keras.file import KerasImportError, attr_list


def layer_key(name):
    """A layer name as a submodule name (no dots: they separate state-dict names)."""
    return str(name).replace(".", "_")


def _variable_name(name):
    """'kernel:0' -> 'kernel'; Keras 2 calls a depthwise kernel 'depthwise_kernel'."""
    name = name.split(":")[0]
    return "kernel" if name == "depthwise_kernel" else name


class LegacyWeights:
    """The legacy layout (full-model /model_weights, or a weights-only file's root).

    Weight names are variable paths, ``[model/]layer/variable[:0]``; the
    second-to-last part names the layer owning the variable, which for a
    nested model's group is one of its inner layers.
    """

    def __init__(self, groups):
        self.groups = groups        # {top-level layer: {owning layer: {variable: array}}}

    @classmethod
    def from_group(cls, group, path):
        """The weights under an h5py group with a ``layer_names`` attribute (``path``: errors)."""
        names = attr_list(group, "layer_names")
        if names is None:
            raise KerasImportError(f"{path}: the weights group has no layer_names attribute")
        groups = {}
        for layer in names:
            if layer not in group:
                raise KerasImportError(f"{path}: layer {layer!r} is listed but has no weights "
                                       "group (truncated or corrupt?)")
            g = group[layer]
            owners = groups.setdefault(layer, {})
            for weight in attr_list(g, "weight_names") or []:
                parts = weight.split("/")
                owner = parts[-2] if len(parts) > 1 else layer
                owners.setdefault(owner, {})[_variable_name(parts[-1])] = np.asarray(
                    g[weight], dtype=np.float32)
        return cls(groups)

    def layer(self, name, class_name, config):
        """{parameter: array} of layer ``name`` in gdnflow's layout (see :func:`to_gdnflow`)."""
        owners = self.groups.get(name, {})
        variables = owners.get(name) or (next(iter(owners.values())) if len(owners) == 1 else {})
        return to_gdnflow(name, class_name, config, variables)

    def nested(self, name):
        """The weights of the layers inside the nested model ``name``."""
        return FlatWeights(self.groups.get(name, {}))

    def flat(self):
        """{layer: {variable: array}} over every layer, nested ones included."""
        return {owner: variables for owners in self.groups.values()
                for owner, variables in owners.items()}


class FlatWeights:
    """A nested model's weights: {layer: {variable: array}} for all layers inside it."""

    def __init__(self, layers):
        self.layers = layers

    def layer(self, name, class_name, config):
        """{parameter: array} of layer ``name`` in gdnflow's layout (see :func:`to_gdnflow`)."""
        return to_gdnflow(name, class_name, config, self.layers.get(name, {}))

    def nested(self, name):
        """Itself: the layers of models nested deeper are in the same table."""
        return self


class StateWeights:
    """Weights already in gdnflow's layout: a state dict by dotted name (from a checkpoint)."""

    def __init__(self, state, prefix=""):
        self.state, self.prefix = state, prefix

    def layer(self, name, class_name, config):
        """{parameter: array} of layer ``name``: the state's entries under its prefix."""
        start = f"{self.prefix}{layer_key(name)}."
        return {k[len(start):]: np.asarray(v) for k, v in self.state.items()
                if k.startswith(start)}

    def nested(self, name):
        """The state of the nested model ``name`` (its entries' prefix)."""
        return StateWeights(self.state, f"{self.prefix}{layer_key(name)}.")


#: Keras 3 weights files name variables by position; these are the layers' orders.
_KERAS3_VARIABLES = {"conv2d": ("kernel", "bias"), "depthwise_conv2d": ("kernel", "bias"),
                     "dense": ("kernel", "bias"),
                     "batch_normalization": ("gamma", "beta", "moving_mean", "moving_variance")}


def read_flat_weights(f, kind, path):
    """{layer: {variable: array}} of any kind of Keras file (nested models' layers too)."""
    if kind == "model":
        return LegacyWeights.from_group(f["model_weights"], path).flat()
    if kind == "legacy":
        return LegacyWeights.from_group(f, path).flat()
    flat = {}

    def visit(group):
        for key, child in group.items():
            if "vars" in child:
                variables = child["vars"]
                name = variables.attrs.get("name", key)
                name = name.decode() if isinstance(name, bytes) else str(name)
                arrays = [np.asarray(variables[str(i)], dtype=np.float32)
                          for i in range(len(variables))]
                if arrays:
                    # The group's key is the layer's class in snake case ("conv2d_1").
                    order = _KERAS3_VARIABLES.get(re.sub(r"_\d+$", "", key), ())
                    if len(arrays) > len(order) or (order and order[0] == "gamma"
                                                    and len(arrays) != 4):
                        # Unknown, or a batch norm without center or scale: which
                        # variable is which cannot be told, and a layer needing
                        # them says so by name.
                        order = tuple(f"var{i}" for i in range(len(arrays)))
                    flat[name] = dict(zip(order, arrays))
            if "layers" in child:
                visit(child["layers"])
    visit(f["layers"])
    return flat


# ------------------------------------------------------ converting weights --
def to_gdnflow(name, class_name, config, variables):
    """A layer's Keras variables ({variable: array}) as gdnflow arrays (NCHW), by parameter name.

    Raises :class:`KerasImportError` naming the layer when a variable it
    needs is missing. Layers without weights give an empty dict.
    """
    def need(var):
        if var not in variables:
            raise KerasImportError(f"layer {name} ({class_name}): the file holds no {var!r} "
                                   f"(it has {sorted(variables) or 'no weights'})")
        return variables[var]
    out = {}
    if class_name == "Conv2D":
        out["weight"] = need("kernel").transpose(3, 2, 0, 1)
    elif class_name == "DepthwiseConv2D":
        kh, kw, channels, mult = need("kernel").shape
        out["weight"] = variables["kernel"].transpose(2, 3, 0, 1).reshape(channels * mult, 1,
                                                                          kh, kw)
    elif class_name == "Dense":
        out["weight"] = need("kernel").T
    elif class_name == "BatchNormalization":
        mean, var = need("moving_mean"), need("moving_variance")
        out["weight"] = variables.get("gamma", np.ones_like(mean))
        out["bias"] = variables.get("beta", np.zeros_like(mean))
        out["running_mean"], out["running_var"] = mean, var
        return out
    else:
        return out
    if config.get("use_bias", True):
        out["bias"] = need("bias")
    return out
