"""A Keras file's weights, read once and handed out per layer in gdnflow's layout.

Keras keeps NHWC kernels; gdnflow NCHW. :func:`to_gdnflow` converts one
layer's variables: Conv2D [kh, kw, in, out] -> [out, in, kh, kw];
DepthwiseConv2D [kh, kw, in, mult] -> [in*mult, 1, kh, kw] (Keras' output
channel c*mult + m is gdnflow's group c, member m); SeparableConv2D's
depthwise kernel the same way (``depthwise.weight``), its pointwise kernel
as a Conv2D's (``pointwise.weight``, with ``pointwise.bias``); Conv1D [k,
in, out] -> [out, in, 1, k]; Dense [in, out] -> [out, in];
BatchNormalization's gamma, beta, moving mean and variance -> weight,
bias, running_mean, running_var; LayerNormalization's gamma, beta ->
weight, bias; PReLU's alpha [H, W, C] of an image -> [C, H, W];
SimpleRNN, LSTM and GRU kernel [in, G units] -> input_weight [G units, in],
recurrent_kernel -> recurrent_weight (transposed the same way), bias ->
bias, or for a GRU with reset_after its [2, 3 units] bias -> bias (the
input's) and recurrent_bias; Bidirectional's two layers' the same, under
``forward_layer.`` and ``backward_layer.``.

In the legacy layout a variable's path names the layer owning it
(``layer/kernel``); an RNN cell's name in the path (``lstm/lstm_cell/kernel``)
is skipped, and a Bidirectional layer's variables are those of its two
wrapped layers (``bi/forward_lstm/lstm_cell/kernel``: owner ``forward_lstm``).

The weight sources (:class:`LegacyWeights`, :class:`FlatWeights`,
:class:`StateWeights`) share one interface: ``layer(name, class_name,
config)`` gives {parameter name: array} in gdnflow's layout and
``nested(name)`` the source of a nested model's layers.
"""
import re

import numpy as np

from gdnflow.io.keras.file import KerasImportError, attr_list
from gdnflow.io.keras.graph import wrapped_layers


def layer_key(name):
    """A layer name as a submodule name (no dots: they separate state-dict names)."""
    return str(name).replace(".", "_")


def _variable_name(name):
    """'kernel:0' -> 'kernel'; Keras 2 calls a depthwise kernel 'depthwise_kernel'."""
    name = name.split(":")[0]
    return "kernel" if name == "depthwise_kernel" else name


#: The names Keras gives the cells inside its recurrent layers ("lstm_cell", "gru_cell_2").
_RNN_CELL = re.compile(r"(simple_rnn|lstm|gru)_cell(_\d+)?")


def _owner(parts, layer):
    """The layer owning the variable at path ``parts`` (its last part is the variable's name)."""
    owners = [p for p in parts[:-1] if not _RNN_CELL.fullmatch(p)]
    return owners[-1] if owners else layer


def _variables(name, class_name, config, owners):
    """{variable: array} of layer ``name``, from ``owners`` ({owning layer: {variable: array}}).

    A Bidirectional layer's are its wrapped layers', as ``forward/kernel``,
    ``backward/kernel``...: the owners Keras names after the wrapped layer.
    """
    if class_name != "Bidirectional":
        return owners.get(name) or {}
    variables = {}
    for direction, (_, wrapped) in zip(("forward", "backward"), wrapped_layers(config)):
        # Keras 3 writes the names it gave them (forward_lstm); Keras 2 the
        # wrapped layer's (lstm), prefixing the direction when it saves.
        wrapped_name = str(wrapped.get("name", ""))
        candidates = (wrapped_name, f"{direction}_{wrapped_name}")
        owner = next((c for c in candidates if c in owners), None)
        for variable, array in (owners[owner] if owner else {}).items():
            variables[f"{direction}/{variable}"] = array
    return variables


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
                owners.setdefault(_owner(parts, layer), {})[_variable_name(parts[-1])] = np.asarray(
                    g[weight], dtype=np.float32)
        return cls(groups)

    def layer(self, name, class_name, config):
        """{parameter: array} of layer ``name`` in gdnflow's layout (see :func:`to_gdnflow`)."""
        owners = self.groups.get(name, {})
        variables = _variables(name, class_name, config, owners) or (
            next(iter(owners.values())) if len(owners) == 1 else {})
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
        return to_gdnflow(name, class_name, config,
                          _variables(name, class_name, config, self.layers))

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
def _depthwise(kernel):
    """A depthwise kernel [kh, kw, in, mult] as [in*mult, 1, kh, kw]."""
    kh, kw, channels, mult = kernel.shape
    return kernel.transpose(2, 3, 0, 1).reshape(channels * mult, 1, kh, kw)


def _recurrent(need, variables, config):
    out = {"input_weight": need("kernel").T, "recurrent_weight": need("recurrent_kernel").T}
    if config.get("use_bias", True):
        bias = need("bias")
        if bias.ndim == 2:          # GRU with reset_after: the input's and the state's
            out["bias"], out["recurrent_bias"] = bias[0], bias[1]
        else:
            out["bias"] = bias
    return out


def _bidirectional(name, config, variables):
    out = {}
    for direction, (wrapped_class, wrapped) in zip(("forward", "backward"),
                                                   wrapped_layers(config)):
        prefix = f"{direction}/"
        own = {k[len(prefix):]: v for k, v in variables.items() if k.startswith(prefix)}
        converted = to_gdnflow(f"{name} ({direction})", wrapped_class, wrapped, own)
        out.update({f"{direction}_layer.{k}": v for k, v in converted.items()})
    return out


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
    bias = "bias"
    if class_name == "Conv2D":
        out["weight"] = need("kernel").transpose(3, 2, 0, 1)
    elif class_name == "DepthwiseConv2D":
        out["weight"] = _depthwise(need("kernel"))
    elif class_name == "SeparableConv2D":
        out["depthwise.weight"] = _depthwise(need("kernel"))
        out["pointwise.weight"] = need("pointwise_kernel").transpose(3, 2, 0, 1)
        bias = "pointwise.bias"
    elif class_name == "Conv1D":
        out["weight"] = need("kernel").transpose(2, 1, 0)[:, :, None, :]
    elif class_name == "Dense":
        out["weight"] = need("kernel").T
    elif class_name == "BatchNormalization":
        mean, var = need("moving_mean"), need("moving_variance")
        out["weight"] = variables.get("gamma", np.ones_like(mean))
        out["bias"] = variables.get("beta", np.zeros_like(mean))
        out["running_mean"], out["running_var"] = mean, var
        return out
    elif class_name == "LayerNormalization":
        if config.get("scale", True):
            out["weight"] = need("gamma")
        if config.get("center", True):
            out["bias"] = need("beta")
        return out
    elif class_name == "PReLU":
        alpha = need("alpha")
        out["alpha"] = alpha.transpose(2, 0, 1) if alpha.ndim == 3 else alpha
        return out
    elif class_name in ("SimpleRNN", "LSTM", "GRU"):
        return _recurrent(need, variables, config)
    elif class_name == "Bidirectional":
        return _bidirectional(name, config, variables)
    else:
        return out
    if config.get("use_bias", True):
        out[bias] = need("bias")
    return out
