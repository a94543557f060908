"""gdnflow modules for Keras' recurrent layers: SimpleRNN, LSTM, GRU and Bidirectional.

They run on sequences [batch, time, features] (Keras' order, which gdnflow
keeps for 3-D values), step by step with linear, slice, concat, the gate
activations and elementwise arithmetic, so they run on both backends and
differentiate through their kernels. Every step's input projection is one
``linear`` ahead of the loop; each step adds its state's projection and
splits the gates. With ``a`` the layer's ``activation`` (tanh by default) and
``s`` its ``recurrent_activation`` (sigmoid), gates in Keras' order::

    SimpleRNN  h' = a(x W + h U + b)
    LSTM       i, f, g, o = s(x Wi + h Ui + bi), s(. f), a(. c), s(. o)
               c' = f c + i g,  h' = o a(c')
    GRU        z, r = s(x Wz + h Uz + bz), s(x Wr + h Ur + br)
               n = a(x Wh + bh + r (h Uh + b'h))       reset_after=True
               n = a(x Wh + bh + (r h) Uh)              reset_after=False
               h' = z h + (1 - z) n

(With reset_after=True, Keras keeps two biases, one on the input and one on
the recurrent projection: ``bias`` and ``recurrent_bias`` here.) Initial
states are zeros. ``return_sequences`` gives every step's h [batch, time,
units], else the last h [batch, units]; ``go_backwards`` runs from the
sequence's end, and its sequence comes out in that (reversed) order, as in
Keras. Bidirectional runs its ``forward_layer`` and ``backward_layer`` (the
latter from the end, its sequence put back in time order) and merges them:
concat (along the features), sum, ave, mul, or None (both, as two outputs).

Weights (gdnflow's layout, :mod:`gdnflow.io.keras.weights`): ``input_weight``
[G units, features] and ``recurrent_weight`` [G units, units], the
transposed Keras kernels, G = 1, 4 or 3 gates; ``bias`` [G units].
"""
import numpy as np

from gdnflow import ops
from gdnflow.io.keras.activations import activate, activation_name, activation_problem
from gdnflow.io.keras.graph import wrapped_layers
from gdnflow.io.keras.layers_parametric import parameter
from gdnflow.nn.module import Module
from gdnflow.tensor import Tensor

#: Recurrent layer class -> gates per step.
GATES = {"SimpleRNN": 1, "LSTM": 4, "GRU": 3}

#: Bidirectional's ways of joining its two directions.
MERGE_MODES = ("concat", "sum", "ave", "mul", None)


def _columns(x, start, stop):
    """x[:, start:stop] of a 2-D tensor."""
    return ops.slice_(x, (slice(None), slice(start, stop)))


class KerasRecurrent(Module):
    """Keras' SimpleRNN, LSTM or GRU (``cell``) on [batch, time, features] (module docstring)."""

    def __init__(self, cell, params, activation, recurrent_activation, return_sequences,
                 go_backwards, reset_after, device):
        super().__init__()
        self.cell = cell
        self.input_weight = parameter(params, "input_weight", device)
        self.recurrent_weight = parameter(params, "recurrent_weight", device)
        self.bias = parameter(params, "bias", device) if "bias" in params else None
        self.reset_after = bool(reset_after) and cell == "GRU"
        self.recurrent_bias = (parameter(params, "recurrent_bias", device)
                               if self.reset_after and "recurrent_bias" in params else None)
        self.units = self.recurrent_weight.shape[1]
        self.activation, self.recurrent_activation = activation, recurrent_activation
        self.return_sequences, self.go_backwards = bool(return_sequences), bool(go_backwards)

    def sequence(self, x, backwards):
        """Every step's h in time order ([batch, units] each), from the end if ``backwards``."""
        if x.ndim != 3:
            raise ValueError(f"{self.cell} takes sequences [batch, time, features], got a "
                             f"{x.ndim}-D input of shape {x.shape}")
        batch, steps, _ = x.shape
        projected = ops.linear(x, self.input_weight, self.bias)
        gates = projected.shape[-1]
        h = Tensor(np.zeros((batch, self.units)), device=x.device, dtype=x.dtype)
        c = h
        units = self.units
        if self.cell == "GRU":
            # Constant over the steps: the gates' part of U and the candidate's.
            gate_weight = ops.slice_(self.recurrent_weight, (slice(0, 2 * units),))
            candidate_weight = ops.slice_(self.recurrent_weight, (slice(2 * units, 3 * units),))
        states = [None] * steps
        for t in (reversed(range(steps)) if backwards else range(steps)):
            step = ops.reshape(ops.slice_(projected, (slice(None), slice(t, t + 1))),
                               (batch, gates))
            if self.cell == "SimpleRNN":
                h = activate(step + ops.linear(h, self.recurrent_weight), self.activation)
            elif self.cell == "LSTM":
                h, c = self._lstm_step(step, h, c)
            elif self.reset_after:
                h = self._gru_step(step, h, ops.linear(h, self.recurrent_weight,
                                                       self.recurrent_bias), None)
            else:
                h = self._gru_step(step, h, ops.linear(h, gate_weight), candidate_weight)
            states[t] = h
        return states

    def _lstm_step(self, step, h, c):
        s = step + ops.linear(h, self.recurrent_weight)
        units, gate = self.units, self.recurrent_activation
        i = activate(_columns(s, 0, units), gate)
        f = activate(_columns(s, units, 2 * units), gate)
        g = activate(_columns(s, 2 * units, 3 * units), self.activation)
        o = activate(_columns(s, 3 * units, 4 * units), gate)
        c = f * c + i * g
        return o * activate(c, self.activation), c

    def _gru_step(self, step, h, recurrent, candidate_weight):
        """One GRU step; ``recurrent`` is h U (+ b'), all three gates with reset_after, else z
        and r only, the candidate's (r h) Uh then coming from ``candidate_weight``."""
        units, gate = self.units, self.recurrent_activation
        z = activate(_columns(step, 0, units) + _columns(recurrent, 0, units), gate)
        r = activate(_columns(step, units, 2 * units) + _columns(recurrent, units, 2 * units),
                     gate)
        if candidate_weight is None:
            inner = r * _columns(recurrent, 2 * units, 3 * units)
        else:
            inner = ops.linear(r * h, candidate_weight)
        n = activate(_columns(step, 2 * units, 3 * units) + inner, self.activation)
        return n + z * (h - n)

    def forward(self, x):
        states = self.sequence(x, self.go_backwards)
        if not self.return_sequences:
            return states[0] if self.go_backwards else states[-1]
        if self.go_backwards:
            states = states[::-1]
        return stack_steps(states)


def stack_steps(states):
    """Steps [batch, units] as one sequence [batch, time, units]."""
    batch, units = states[0].shape
    steps = [ops.reshape(h, (batch, 1, units)) for h in states]
    return ops.concat(steps, axis=1) if len(steps) > 1 else steps[0]


class KerasBidirectional(Module):
    """Keras' Bidirectional: ``forward_layer`` and ``backward_layer`` merged (module docstring)."""

    def __init__(self, forward_layer, backward_layer, merge_mode):
        super().__init__()
        self.forward_layer, self.backward_layer = forward_layer, backward_layer
        self.merge_mode = merge_mode

    def forward(self, x):
        y, backward = self.forward_layer(x), self.backward_layer
        states = backward.sequence(x, backward.go_backwards)
        if backward.return_sequences:
            # Keras flips the backward layer's output (in its running order) along time.
            y_reverse = stack_steps(states if backward.go_backwards else states[::-1])
        else:
            y_reverse = states[0] if backward.go_backwards else states[-1]
        if self.merge_mode == "concat":
            return ops.concat([y, y_reverse], axis=-1)
        if self.merge_mode == "sum":
            return y + y_reverse
        if self.merge_mode == "ave":
            return (y + y_reverse) * 0.5
        if self.merge_mode == "mul":
            return y * y_reverse
        return y, y_reverse


# --------------------------------------------------------------- builders --
def _build_recurrent(class_name, config, params, device):
    return KerasRecurrent(
        class_name, params, activation_name(config.get("activation", "tanh")),
        activation_name(config.get("recurrent_activation", "sigmoid")),
        config.get("return_sequences", False), config.get("go_backwards", False),
        config.get("reset_after", "recurrent_bias" in params), device)


def _recurrent(class_name):
    return lambda name, config, params, device: _build_recurrent(class_name, config, params,
                                                                 device)


def _build_bidirectional(name, config, params, device):
    (forward_class, forward), (backward_class, backward) = wrapped_layers(config)

    def direction(prefix):
        return {key[len(prefix):]: value for key, value in params.items()
                if key.startswith(prefix)}
    return KerasBidirectional(
        _build_recurrent(forward_class, forward, direction("forward_layer."), device),
        _build_recurrent(backward_class, backward, direction("backward_layer."), device),
        config.get("merge_mode", "concat"))


#: Keras layer class -> builder(name, config, params in gdnflow layout, device) -> Module.
RECURRENT_LAYERS = {"SimpleRNN": _recurrent("SimpleRNN"), "LSTM": _recurrent("LSTM"),
                    "GRU": _recurrent("GRU"), "Bidirectional": _build_bidirectional}


def recurrent_problems(class_name, config):
    """What gdnflow cannot run in a layer of :data:`RECURRENT_LAYERS` (empty: all fine)."""
    if class_name == "Bidirectional":
        problems = []
        if config.get("merge_mode", "concat") not in MERGE_MODES:
            problems.append(f"merge_mode {config.get('merge_mode')!r} (supported: "
                            f"{', '.join(map(str, MERGE_MODES))})")
        for wrapped_class, wrapped in wrapped_layers(config):
            if wrapped_class not in GATES:
                problems.append(f"a wrapped {wrapped_class} (supported: "
                                f"{', '.join(GATES)})")
            else:
                problems += [f"wrapped {wrapped_class}: {p}"
                             for p in recurrent_problems(wrapped_class, wrapped)]
        return sorted(set(problems), key=problems.index)
    problems = [p for p in (activation_problem(config),
                            activation_problem(config, "recurrent_activation")) if p]
    for option, what in (("return_state", "the states as outputs"),
                         ("stateful", "states kept between batches"),
                         ("time_major", "sequences [time, batch, features]")):
        if config.get(option):
            problems.append(f"{option}=True ({what})")
    return problems
