"""ONNX's recurrent operators (RNN, GRU, LSTM), composed from gdnflow operators.

Each runs its cell step by step over the sequence with linear, slice,
reshape, concat, the gate activations and elementwise arithmetic, so it runs
on both backends and differentiates through their kernels. The input
projection of every time step is one ``linear`` ahead of the loop (x [S, B,
I] by W [G H, I], with the biases that are plain sums folded in); each step
then adds its hidden state's projection by R and splits the G gates.

With H the hidden state, C the LSTM cell state and (f, g, h) the direction's
activations (by default Sigmoid, Tanh, Tanh; RNN's f is Tanh), gates in
ONNX's order (LSTM i o f c, GRU z r h)::

    RNN   H' = f(x Wi + H Ri + Wbi + Rbi)
    GRU   z = f(x Wz + H Rz + bz), r = f(x Wr + H Rr + br)
          n = g(x Wh + (r H) Rh + Rbh + Wbh)          linear_before_reset=0
          n = g(x Wh + r (H Rh + Rbh) + Wbh)          linear_before_reset=1
          H' = n + z (H - n)
    LSTM  i = f(x Wi + H Ri + Pi C + bi), f_ = f(x Wf + H Rf + Pf C + bf)
          (f_ = 1 - i with input_forget), c = g(x Wc + H Rc + bc)
          C' = f_ C + i c, o = f(x Wo + H Ro + Po C' + bo), H' = o h(C')

``clip`` bounds every activation's input to [-clip, clip]. Outputs: Y (every
step's H, [S, D, B, H]; [B, S, D, H] with layout=1), Y_h (the last H, [D, B,
H]) and for LSTM Y_c (the last C). ``direction`` reverse runs the sequence
from its end; bidirectional runs both, D = 2.

Refused: ``sequence_lens`` shorter than the sequence for some batch entry
(the handler checks it when the node runs), and ``activation_alpha`` /
``activation_beta`` (parameterised activations run with ONNX's defaults):
see :data:`gdnflow.io.onnx_support.ATTRIBUTES`.
"""
import numpy as np

from gdnflow import ops
from gdnflow.io.onnx_values import as_tensor, host
from gdnflow.tensor import Tensor

#: Activations of the recurrent operators, with the defaults of their ONNX operators.
ACTIVATIONS = {
    "Sigmoid": ops.sigmoid, "Tanh": ops.tanh, "Relu": ops.relu, "Softplus": ops.softplus,
    "Softsign": lambda x: x / (ops.abs(x) + 1.0),
    "HardSigmoid": lambda x: ops.clamp(ops.affine(x, 0.2, 0.5), 0, 1),
    "LeakyRelu": lambda x: ops.relu(x) - 0.01 * ops.relu(ops.neg(x)),
    "Elu": lambda x: ops.relu(x) + (ops.exp(ops.neg(ops.relu(ops.neg(x)))) - 1.0),
}

#: op type -> (gates per step, default activations of one direction).
CELLS = {"RNN": (1, ("Tanh",)), "GRU": (3, ("Sigmoid", "Tanh")),
         "LSTM": (4, ("Sigmoid", "Tanh", "Tanh"))}


def _direction(value, index, device):
    """``value`` [D, ...] at direction ``index``, as a tensor of shape [...]."""
    value = as_tensor(value, device)
    return ops.reshape(ops.slice_(value, (slice(index, index + 1),)), value.shape[1:])


def _columns(x, start, stop):
    """x[..., start:stop] of a 2-D or 1-D tensor."""
    lead = (slice(None),) * (x.ndim - 1)
    return ops.slice_(x, lead + (slice(start, stop),))


class _Cell:
    """One direction's weights and activations; ``step`` maps (x projection, H, C) to (H', C')."""

    def __init__(self, node, inputs, index, device):
        x, w, r, b = (list(inputs) + [None] * 4)[:4]
        self.op_type = node.op_type
        gates, defaults = CELLS[node.op_type]
        self.hidden = r.shape[-1]
        names = node.attr("activations") or list(defaults) * (2 if _bidirectional(node) else 1)
        per = len(defaults)
        self.activations = [ACTIVATIONS[n] for n in names[index * per:(index + 1) * per]]
        self.clip = node.attr("clip")
        self.input_forget = bool(node.attr("input_forget", 0))
        self.linear_before_reset = bool(node.attr("linear_before_reset", 0))
        self.w, self.r = _direction(w, index, device), _direction(r, index, device)
        size = gates * self.hidden
        self.bias, self.recurrent_h_bias = None, None
        if b is not None:
            b = _direction(b, index, device)
            w_bias, r_bias = _columns(b, 0, size), _columns(b, size, 2 * size)
            if self.op_type == "GRU" and self.linear_before_reset:
                # Rbh sits inside the reset gate's product: only the others are plain sums.
                self.recurrent_h_bias = _columns(r_bias, 2 * self.hidden, size)
                zeros = Tensor(np.zeros(self.hidden), device=device, dtype=b.dtype)
                r_bias = ops.concat([_columns(r_bias, 0, 2 * self.hidden), zeros])
            self.bias = w_bias + r_bias
        p = inputs[7] if len(inputs) > 7 else None
        self.peepholes = None if p is None else [
            _columns(_direction(p, index, device), k * self.hidden, (k + 1) * self.hidden)
            for k in range(3)]

    def project(self, x):
        """Every step's input projection (with the summed biases): x [S, B, I] -> [S, B, G H]."""
        return ops.linear(x, self.w, self.bias)

    def _act(self, k, x):
        if self.clip is not None:
            x = ops.clamp(x, -self.clip, self.clip)
        return self.activations[k](x)

    def step(self, projected, h, c):
        gate = lambda s, k: _columns(s, k * self.hidden, (k + 1) * self.hidden)  # noqa: E731
        if self.op_type == "RNN":
            return self._act(0, projected + ops.linear(h, self.r)), None
        if self.op_type == "GRU":
            hidden_2 = 2 * self.hidden
            recurrent = ops.linear(h, ops.slice_(self.r, (slice(0, hidden_2),)))
            z = self._act(0, gate(projected, 0) + gate(recurrent, 0))
            reset = self._act(0, gate(projected, 1) + gate(recurrent, 1))
            r_h = ops.slice_(self.r, (slice(hidden_2, 3 * self.hidden),))
            if self.linear_before_reset:
                inner = ops.linear(h, r_h, self.recurrent_h_bias)
                n = self._act(1, gate(projected, 2) + reset * inner)
            else:
                n = self._act(1, gate(projected, 2) + ops.linear(reset * h, r_h))
            return n + z * (h - n), None
        s = projected + ops.linear(h, self.r)
        peep = self.peepholes
        i = self._act(0, gate(s, 0) + peep[0] * c if peep else gate(s, 0))
        if self.input_forget:
            f = 1.0 - i
        else:
            f = self._act(0, gate(s, 2) + peep[2] * c if peep else gate(s, 2))
        c = f * c + i * self._act(1, gate(s, 3))
        o = self._act(0, gate(s, 1) + peep[1] * c if peep else gate(s, 1))
        return o * self._act(2, c), c


def _bidirectional(node):
    return node.attr("direction", "forward") == "bidirectional"


def _initial(value, index, like, hidden, device, batch_first):
    """Direction ``index``'s initial state [B, H]: given ([D, B, H], or [B, D, H]
    with layout=1) or zeros (of the type of ``like``, the input [S, B, I])."""
    if value is None:
        return Tensor(np.zeros((like.shape[1], hidden)), device=device, dtype=like.dtype)
    value = as_tensor(value, device)
    return _direction(ops.transpose(value, (1, 0, 2)) if batch_first else value, index, device)


def recurrent(node, inputs, device):
    """Handler of RNN, GRU and LSTM: [Y, Y_h] (and Y_c for LSTM)."""
    inputs = list(inputs) + [None] * (8 - len(inputs))
    x, lengths = as_tensor(inputs[0], device), inputs[4]
    batch_first = bool(node.attr("layout", 0))
    if batch_first:
        x = ops.transpose(x, (1, 0, 2))
    steps, batch = x.shape[:2]
    if lengths is not None and np.any(host(lengths) != steps):
        node.fail(f"sequence_lens {host(lengths).tolist()} shorter than the sequence ({steps} "
                  "steps; gdnflow runs whole sequences)")
    direction = node.attr("direction", "forward")
    orders = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]
    ys, last_h, last_c = [], [], []
    for index, backwards in enumerate(orders):
        cell = _Cell(node, inputs, index, device)
        h = _initial(inputs[5], index, x, cell.hidden, device, batch_first)
        c = _initial(inputs[6], index, x, cell.hidden, device, batch_first)
        projected = cell.project(x)
        states = [None] * steps
        for t in (reversed(range(steps)) if backwards else range(steps)):
            step_input = ops.reshape(ops.slice_(projected, (slice(t, t + 1),)),
                                     (batch, projected.shape[-1]))
            h, c = cell.step(step_input, h, c)
            states[t] = ops.reshape(h, (1, 1, batch, cell.hidden))
        ys.append(ops.concat(states, axis=0) if steps > 1 else states[0])
        last_h.append(ops.reshape(h, (1, batch, cell.hidden)))
        last_c.append(None if c is None else ops.reshape(c, (1, batch, cell.hidden)))
    join = lambda parts, axis: ops.concat(parts, axis=axis) if len(parts) > 1 else parts[0]  # noqa: E731
    y, y_h = join(ys, 1), join(last_h, 0)
    y_c = join(last_c, 0) if node.op_type == "LSTM" else None
    if batch_first:
        y = ops.transpose(y, (2, 0, 1, 3))
        y_h, y_c = [None if v is None else ops.transpose(v, (1, 0, 2)) for v in (y_h, y_c)]
    return [y, y_h] if y_c is None else [y, y_h, y_c]


HANDLERS = {"RNN": recurrent, "GRU": recurrent, "LSTM": recurrent}
