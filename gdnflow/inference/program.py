"""The program an inference plan runs: straight-line :class:`Step` objects over numbered values.

Value numbers stand for tensors: the model's input, constants (weights, and
what was computed from weights alone), and each step's result. A step reads
values and produces one; :class:`Program` runs the steps in order and lets go
of each value right after its last reader.
"""
import dataclasses

from gdnflow.autograd import Operator
from gdnflow.ops import conv2d
from gdnflow.ops.conv import ACTIVATIONS


@dataclasses.dataclass
class Step:
    """One operator application of a program: ``values[output] = call(*values[inputs])``.

    ``call`` is the traced operator object, or a :class:`FusedConv`; ``name``
    names the operator and ``fused`` what was folded into it.
    """

    call: object
    inputs: tuple
    output: int
    name: str
    fused: tuple = ()


@dataclasses.dataclass(frozen=True)
class FusedConv:
    """conv2d with what the rewrite passes fused into it, run by :func:`gdnflow.ops.conv2d`.

    Inputs in the order x, w, then b if ``has_bias``, then the residual if
    ``has_residual``. ``activation`` is None, "relu" or "relu6".
    """

    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int
    activation: object = None
    has_bias: bool = False
    has_residual: bool = False

    def __call__(self, x, w, *extras):
        b = extras[0] if self.has_bias else None
        residual = extras[-1] if self.has_residual else None
        return conv2d(x, w, b, self.stride, self.padding, self.dilation, self.groups,
                      activation=self.activation, residual=residual)

    @classmethod
    def of(cls, call):
        """The FusedConv computing what ``call`` (a traced conv2d operator or a FusedConv) does."""
        if isinstance(call, FusedConv):
            return call
        # ACTIVATIONS: name -> the code the operator stores
        names = {code: name for name, code in ACTIVATIONS.items() if name != "none"}
        return cls(call.stride, call.padding, call.dilation, call.groups,
                   names[call.activation], call.has_bias, call.has_residual)


class Program:
    """A straight-line sequence of :class:`Step` over numbered values.

    Value ``input_value`` is the model's input; ``constants`` maps values to
    the tensors they always hold; ``outputs`` are the values returned, packed
    as one tensor (``output_kind == "tensor"``) or a tuple or list;
    ``shapes`` records every value's shape from the trace.
    """

    def __init__(self, steps, constants, input_value, outputs, output_kind, shapes):
        self.steps = list(steps)
        self.constants = dict(constants)
        self.input_value = input_value
        self.outputs = tuple(outputs)
        self.output_kind = output_kind
        self.shapes = dict(shapes)
        self.refresh()

    def refresh(self):
        """Recompute, after a rewrite, which values each step lets go of.

        A value is dropped right after its last reader, so that its memory
        returns to the pool (and, when planning, its lifetime ends) there.
        """
        last = {}
        for index, step in enumerate(self.steps):
            for v in step.inputs:
                last[v] = index
            last.setdefault(step.output, index)
        keep = set(self.outputs) | set(self.constants)
        self.dead_after = [[] for _ in self.steps]
        for v, index in last.items():
            if v not in keep:
                self.dead_after[index].append(v)
        self.constants = {v: t for v, t in self.constants.items()
                          if v in last or v in self.outputs}

    def uses(self):
        """{value: how many step inputs and program outputs read it}."""
        count = {}
        for step in self.steps:
            for v in step.inputs:
                count[v] = count.get(v, 0) + 1
        for v in self.outputs:
            count[v] = count.get(v, 0) + 1
        return count

    def run(self, x):
        """The output tensors (a list, in ``outputs`` order) for the input tensor ``x``."""
        env = dict(self.constants)
        env[self.input_value] = x
        for step, dead in zip(self.steps, self.dead_after):
            call = step.call
            env[step.output] = call(*[env[v] for v in step.inputs])
            if isinstance(call, Operator):
                # The traced operator object is reused on every run: let go of
                # whatever it kept for a backward that never comes, or it would
                # hold a buffer until the next run.
                call.release()
            for v in dead:
                del env[v]
        return [env[v] for v in self.outputs]

    def pack(self, tensors):
        """``tensors`` (one per output value) in the model's output structure."""
        if self.output_kind == "tensor":
            return tensors[0]
        return tuple(tensors) if self.output_kind == "tuple" else list(tensors)

    def describe(self):
        """One line per step: the operator, what was fused into it, the output shape."""
        lines = []
        for step in self.steps:
            fused = "".join(f"+{f}" for f in step.fused)
            lines.append(f"{step.name}{fused} -> {self.shapes.get(step.output)}")
        return "\n".join(lines)
