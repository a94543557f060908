"""Import ONNX models as gdnflow modules::

    model = gdnflow.io.onnx.load("mobilenet_v2.onnx", device="cuda")
    probabilities = model(gdnflow.tensor(images, device="cuda"))

:func:`load` reads the file, checks every node against the supported
operators and reports all unsupported ones at once, by name, before anything
runs. The result is an :class:`OnnxModule`: float initializers become its
parameters (so ``state_dict``, ``to`` and checkpoints work), as do float
weights written as ``Constant`` nodes, and ``forward``
runs the nodes in the graph's (topological) order with gdnflow operators.

Values flow in two kinds: device tensors (activations and weights) and host
NumPy arrays (integer tensors and constants). The shape arithmetic exporters
emit (Shape, Gather, Slice, Cast, Constant, ConstantOfShape, Concat,
Unsqueeze, ...) computes on host arrays with NumPy: nodes whose inputs are
all known at import time are folded then, once; a Shape of an activation
(known only at run time when the input has a symbolic dimension) is read off
the tensor, with no kernel launched for any of it.

Supported (opset 7 and later, float32 tensors): Conv, ConvTranspose, Gemm,
MatMul, Add, Sub, Mul, Div, Relu, Clip, Sigmoid, BatchNormalization,
MaxPool, AveragePool, GlobalAveragePool, Flatten, Reshape, Transpose,
Squeeze, Unsqueeze, Concat, Pad, Softmax, Dropout, Identity, Shape, Gather,
Slice, Cast, Constant, ConstantOfShape; composed from gdnflow's operators
(forward and backward on both backends, or NumPy on the host for the
piecewise-constant and integer ones) by :mod:`gdnflow.io.onnx_ops`,
:mod:`gdnflow.io.onnx_ops_math`, :mod:`gdnflow.io.onnx_ops_reduce`,
:mod:`gdnflow.io.onnx_ops_index` and :mod:`gdnflow.io.onnx_resize`: the
activations, arithmetic, erf and trigonometry, comparisons and logic,
reductions, normalisations, indexing, Einsum, Resize (every mode but
tf_crop_and_resize and antialias); ``HANDLERS`` lists them all;
and nodes of custom domains whose op type a registered (plugin) operator
declares (see :func:`custom_operator`). Dropout's mask output is all true.
Attributes, values and outputs outside gdnflow's operators (ceil_mode
pooling, non-constant padding modes, SAME padding of a transposed convolution,
attributes of opsets before 7...: :mod:`gdnflow.io.onnx_support` lists what
runs) are refused at load together with unsupported operators, in one
:class:`OnnxImportError` naming each node; what depends on the input (1-D and
3-D activations) is refused when the node runs. The module comes back in eval
mode, as from ``gdnflow.io.keras.load``.
"""
import numpy as np

from gdnflow import registry
from gdnflow.backends import default_device
from gdnflow.io import (onnx_ops, onnx_ops_core, onnx_ops_index, onnx_ops_math,
                        onnx_ops_reduce, onnx_ops_rnn)
from gdnflow.io.onnx_support import unsupported_features
from gdnflow.io.onnx_values import OnnxImportError, as_tensor, is_host
from gdnflow.nn.module import Module, Parameter
from gdnflow.tensor import Tensor


def load(path, device=None):
    """Read an ONNX file into an :class:`OnnxModule` on ``device`` (default device if None)."""
    try:
        import onnx     # local import: onnx is optional (gdnflow[test]), loaded on first use
    except ImportError:
        raise OnnxImportError("reading ONNX files needs the onnx package: pip install onnx") from None
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except FileNotFoundError:
        raise OnnxImportError(f"{path}: no such file") from None
    except Exception as exc:    # protobuf's DecodeError, onnx's ValidationError, ...
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OnnxImportError(f"{path} is not a valid ONNX model: {first_line}") from None
    return OnnxModule(model, device=device, source=str(path))


class OnnxModule(Module):
    """A gdnflow module that runs an imported ONNX graph.

    ``input_names`` and ``output_names`` list the graph's inputs and outputs;
    ``forward(*inputs)`` takes tensors in that order (float NumPy arrays are
    moved to the module's device, integer ones stay on the host) and returns
    one output, or a tuple when the graph has several; an output computed by
    shape arithmetic alone is a NumPy array.
    """

    def __init__(self, model, device=None, source="<model>"):
        super().__init__()
        from onnx import numpy_helper   # local import: onnx is optional, loaded on first use
        self.device = device or default_device()
        self.source = source
        graph = model.graph
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
        problems = unsupported(graph)
        if problems:
            raise OnnxImportError(f"{source}: {problems}")
        initializers = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        for value in list(graph.input) + list(graph.output):
            if not value.type.HasField("tensor_type"):
                raise OnnxImportError(f"{source}: graph input/output {value.name!r} is a "
                                      f"{value.type.WhichOneof('value')}, which is not supported (only tensors)")
        self.input_names = [i.name for i in graph.input if i.name not in initializers]
        self.output_names = [o.name for o in graph.output]
        self._parameter_of = {}     # ONNX value name -> attribute name of its Parameter
        constants = {}
        for name, array in initializers.items():
            if _is_weight(array):
                self._add_parameter(name, array)
            else:
                constants[name] = array
        self._nodes = []
        constant_nodes = set()
        for node in graph.node:
            step = _Node(node, self.opset)
            if all(name in constants or name == "" for name in step.inputs) and step.foldable:
                for out, value in zip(step.outputs, step.run([constants.get(n) for n in step.inputs],
                                                             self.device)):
                    constants[out] = value
                if step.op_type == "Constant":
                    constant_nodes.add(step.outputs[0])
            else:
                self._nodes.append(step)
        # Weights written as Constant nodes rather than initializers (some exporters
        # do): those that nodes run at forward time read are parameters as well.
        read_at_forward = {name for step in self._nodes for name in step.inputs}
        for name in sorted(constant_nodes & read_at_forward, key=list(constants).index):
            if _is_weight(constants[name]):
                self._add_parameter(name, constants.pop(name))
        self._constants = constants
        self.eval()     # an imported graph is for inference, as a Keras model's is

    def _add_parameter(self, name, array):
        """ONNX value ``name`` as a (frozen) Parameter of this module."""
        attribute = f"param{len(self._parameter_of)}"
        setattr(self, attribute, Parameter(array, device=self.device, requires_grad=False))
        self._parameter_of[name] = attribute

    def forward(self, *inputs):
        if len(inputs) != len(self.input_names):
            raise TypeError(f"{self.source}: the graph takes {len(self.input_names)} inputs "
                            f"({', '.join(self.input_names)}), got {len(inputs)}")
        values = dict(self._constants)
        for name, attribute in self._parameter_of.items():
            values[name] = getattr(self, attribute)
        for name, value in zip(self.input_names, inputs):
            if not isinstance(value, Tensor):
                value = np.asarray(value)
                # float32 inputs go to the device; others (shapes, indices, or
                # other float types that only shape arithmetic may consume) stay host arrays.
                value = Tensor(value, device=self.device) if value.dtype == np.float32 else value
            values[name] = value
        for step in self._nodes:
            try:
                results = step.run([values.get(n) if n else None for n in step.inputs], self.device)
            except OnnxImportError:
                raise
            except Exception as exc:
                raise type(exc)(f"{self.source}: node {step.name} ({step.op_type}): {exc}") from exc
            for out, value in zip(step.outputs, results):
                values[out] = value
        outputs = [values[n] for n in self.output_names]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def unsupported(graph):
    """What of ``graph`` (an ONNX GraphProto) gdnflow cannot run, as one line; "" if nothing.

    Every unsupported operator, and every node's attribute, value or extra
    output that :mod:`gdnflow.io.onnx_support` does not list as runnable.
    """
    from onnx import helper     # local import: onnx is optional, loaded on first use
    missing, features = {}, []
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            if custom_operator(node.domain, node.op_type) is None:
                missing.setdefault(f"{node.domain}.{node.op_type}", []).append(
                    node.name or "(unnamed)")
        elif node.op_type not in HANDLERS:
            missing.setdefault(node.op_type, []).append(node.name or "(unnamed)")
        else:
            attributes = {a.name: _decoded(helper.get_attribute_value(a)) for a in node.attribute}
            found = unsupported_features(node.op_type, attributes, list(node.output))
            if found:
                features.append(f"node {_node_name(node)} ({node.op_type}): "
                                f"{', '.join(found)} is not supported")
    if missing:
        features.insert(0, "unsupported ONNX operators: " + "; ".join(
            f"{op} (nodes {', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
            for op, names in sorted(missing.items())))
    return "; ".join(features)


class _Node:
    """One ONNX node: its attributes decoded once, run by its handler."""

    # Ops that may run on host arrays at import time when all inputs are known.
    HOST_OPS = (onnx_ops_core.HOST_OPS | onnx_ops.HOST_OPS | onnx_ops_math.HOST_OPS
                | onnx_ops_reduce.HOST_OPS | onnx_ops_index.HOST_OPS)

    def __init__(self, node, opset):
        from onnx import helper     # local import: onnx is optional, loaded on first use
        self.op_type = node.op_type
        self.domain = node.domain if node.domain not in ("", "ai.onnx") else ""
        self.name = _node_name(node)
        self.inputs = list(node.input)
        self.outputs = list(node.output)
        self.opset = opset
        self.attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        self.foldable = not self.domain and self.op_type in self.HOST_OPS

    def attr(self, name, default=None):
        """An attribute's value (bytes decoded to str), or ``default``."""
        return _decoded(self.attrs.get(name, default))

    def fail(self, feature):
        """Raise OnnxImportError naming this node and what it uses that gdnflow lacks."""
        raise OnnxImportError(f"node {self.name} ({self.op_type}): {feature} is not supported")

    def run(self, inputs, device):
        """The outputs for ``inputs`` (Tensors or NumPy arrays; None for omitted ones)."""
        if self.domain:
            operator_class = custom_operator(self.domain, self.op_type)
            attributes = {k: self.attr(k) for k in self.attrs}
            from_onnx = getattr(operator_class, "from_onnx", None)
            operator = (from_onnx(attributes) if from_onnx is not None
                        else operator_class(**attributes))
            result = operator(*[as_tensor(v, device) for v in inputs if v is not None])
            return result if isinstance(result, (list, tuple)) else [result]
        data = inputs[0] if inputs else None
        if self.op_type not in self.HOST_OPS and is_host(data):
            if data.dtype != np.float32:
                self.fail(f"{data.dtype} data (gdnflow computes in float32; other types only "
                          "in shape arithmetic)")
            inputs = [Tensor(data, device=device)] + list(inputs[1:])
        result = HANDLERS[self.op_type](self, inputs, device)
        return result if isinstance(result, (list, tuple)) else [result]


# ------------------------------------------------- plugin operators --
def custom_operator(domain, op_type):
    """The registered operator class that declares ``onnx_op = (domain, op_type)``, or None.

    This is how plugin operators import from ONNX: a plugin's operator class
    sets ``onnx_op`` and, if its constructor does not take the node's
    attributes as keyword arguments, a classmethod ``from_onnx(attributes)``
    returning an operator instance. Installed plugins are loaded the first
    time an unknown custom op is met.
    """
    def find():
        for name in registry.names():
            cls = registry.get(name)
            if getattr(cls, "onnx_op", None) == (domain, op_type):
                return cls
        return None

    found = find()
    if found is None:
        # Asked for a name nothing has registered, the registry runs its
        # on_unknown_name hooks (gdnflow's plugin layer loads the installed
        # plugins there), then it raises KeyError: look again after that.
        try:
            registry.get(f"{domain}.{op_type}")
        except KeyError:
            pass
        found = find()
    return found


# --------------------------------------------------------------- helpers --
def _is_weight(array):
    """Whether a constant is a weight (a float tensor of several elements) rather
    than a number or a shape, which stay host constants."""
    return array.dtype.kind == "f" and array.ndim > 0 and array.size > 1


def _node_name(node):
    return node.name or f"{node.op_type}->{node.output[0]}"


def _decoded(value):
    """An attribute value with bytes (ONNX strings, alone or in a list) as str."""
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode() for v in value]
    return value.decode() if isinstance(value, bytes) else value


#: Every ONNX operator the importer runs: op type -> handler(node, inputs, device).
HANDLERS = {**onnx_ops_core.HANDLERS, **onnx_ops.HANDLERS, **onnx_ops_math.HANDLERS,
            **onnx_ops_reduce.HANDLERS, **onnx_ops_index.HANDLERS, **onnx_ops_rnn.HANDLERS}
