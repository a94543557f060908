"""Tracing: one forward of a model recorded as a :class:`~gdnflow.inference.program.Program`.

The model runs under ``no_grad`` with :func:`gdnflow.autograd.trace` reporting
each outermost operator application: the operator, the tensors it read and
the tensor it produced. Values are numbered; a tensor read before anything
produced it (a parameter, a buffer, a tensor made inside ``forward``) is a
constant of the program. The program is what this input shape did: Python
control flow in ``forward`` is frozen.
"""
import warnings

from gdnflow import autograd
from gdnflow.autograd import no_grad
from gdnflow.inference.errors import PlanError
from gdnflow.inference.program import Program, Step
from gdnflow.tensor import Tensor


class _Tracer:
    """Records operator applications as :class:`Step` objects over numbered values.

    Values are told apart by the identity of their Tensor objects (and of
    their backend arrays, so that another wrapper of a traced array is the
    same value, not a constant). Every traced tensor is kept alive until the
    trace ends, so that no id is reused for another object meanwhile.
    """

    def __init__(self):
        self.steps = []
        self.by_tensor = {}
        self.by_array = {}
        self.constants = {}
        self.shapes = {}
        self.alive = []

    def new_value(self, tensor):
        v = len(self.shapes)
        self.by_tensor[id(tensor)] = v
        self.by_array[id(tensor.data)] = v
        self.shapes[v] = tuple(tensor.shape)
        self.alive.append(tensor)
        return v

    def value_of(self, tensor):
        v = self.by_tensor.get(id(tensor))
        if v is None:
            v = self.by_array.get(id(tensor.data))
            if v is not None:
                self.by_tensor[id(tensor)] = v
                self.alive.append(tensor)
            else:
                v = self.new_value(tensor)
                self.constants[v] = tensor
        return v

    def record(self, op, inputs, output):
        values = tuple(self.value_of(t) for t in inputs)
        self.steps.append(Step(op, values, self.new_value(output), op.label))


def _flatten_outputs(result):
    """(list of output tensors, "tensor" | "tuple" | "list") of what a model returned."""
    if isinstance(result, Tensor):
        return [result], "tensor"
    if isinstance(result, (tuple, list)) and all(isinstance(t, Tensor) for t in result):
        return list(result), "tuple" if isinstance(result, tuple) else "list"
    raise PlanError(f"compile: the model must return a Tensor or a tuple/list of Tensors, "
                    f"got {type(result).__name__}")


def trace(model, x):
    """Run ``model(x)`` under no_grad, recording its operators: (Program, model output list).

    The program's input value is ``x``; tensors read before any operator
    produced them are its constants. Warns (UserWarning) when a constant is
    neither a parameter nor a buffer of ``model`` (a tensor ``forward`` made:
    it is frozen); raises :class:`~gdnflow.inference.errors.PlanError` when the
    model returns anything but a Tensor or a tuple or list of Tensors.
    """
    tracer = _Tracer()
    input_value = tracer.new_value(x)
    with no_grad(), autograd.trace(tracer.record):
        result = model(x)
    outputs, kind = _flatten_outputs(result)
    output_values = [tracer.value_of(t) for t in outputs]
    state = {id(t) for t in list(model.parameters()) + list(model.buffers())}
    foreign = [tracer.shapes[v] for v, t in tracer.constants.items() if id(t) not in state]
    if foreign:
        warnings.warn(f"compile: {len(foreign)} tensor(s) that are neither parameters nor "
                      f"buffers of the model (shapes {foreign[:4]}) are frozen into the plan "
                      "as constants", stacklevel=3)
    program = Program(tracer.steps, tracer.constants, input_value, output_values, kind,
                      tracer.shapes)
    return program, outputs
