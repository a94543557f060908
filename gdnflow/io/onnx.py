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

Supported (opsets 7 to 21, and later ones where their operators kept a form
gdnflow reads; float32 tensors): ``HANDLERS`` lists every
operator, composed from gdnflow's operators (forward and backward on both
backends, or NumPy on the host for the piecewise-constant and integer ones)
by family: :mod:`gdnflow.io.onnx_ops_core` (convolution, Gemm, arithmetic,
pooling, the shape arithmetic), :mod:`gdnflow.io.onnx_ops` (activations,
normalisations, Resize), :mod:`gdnflow.io.onnx_ops_math`,
:mod:`gdnflow.io.onnx_ops_reduce`, :mod:`gdnflow.io.onnx_ops_index`,
:mod:`gdnflow.io.onnx_ops_rnn` (RNN, GRU, LSTM), :mod:`gdnflow.io.onnx_control`
(If, Loop) and :mod:`gdnflow.io.onnx_ops_quant` (DequantizeLinear of weights;
quantised graphs are refused in one line); and nodes of custom domains whose
op type a registered (plugin) operator declares (see :func:`custom_operator`).
Each node takes the form of its operator's version in the model's opset
(``node.opset``: Softmax flattens to 2-D before opset 13, Squeeze's axes are
an input from 13...), and a node whose form is not its version's (an
operator the opset lacks, an attribute or input its version does not take, a
form older than opset 7) is refused at load, naming the version
(:mod:`gdnflow.io.onnx_opsets`). Dropout's mask output is all true.
Attributes, values and outputs outside gdnflow's operators (dilated or 3-D
pooling, SAME padding of a transposed convolution...: :mod:`gdnflow.io.onnx_support` lists what runs) are refused at load together
with unsupported operators, those inside subgraphs (If, Loop, Scan) included,
in one :class:`OnnxImportError` naming each node; so is an If or Loop steered
by float data. What depends on the input (1-D and 3-D activations) is
refused when the node runs. The module comes back in eval mode, as from
``gdnflow.io.keras.load``.
"""
import numpy as np

from gdnflow import registry
from gdnflow.backends import default_device
from gdnflow.io import (onnx_control, onnx_ops, onnx_ops_core, onnx_ops_index, onnx_ops_math,
                        onnx_ops_quant, onnx_ops_reduce, onnx_ops_rnn)
from gdnflow.io.onnx_opsets import version_problems
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
        _check_model(onnx, model)
    except FileNotFoundError:
        raise OnnxImportError(f"{path}: no such file") from None
    except Exception as exc:    # protobuf's DecodeError, onnx's ValidationError, ...
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OnnxImportError(f"{path} is not a valid ONNX model: {first_line}") from None
    return OnnxModule(model, device=device, source=str(path))


#: The private domain that :func:`_check_model` moves deprecated nodes to.
_SET_ASIDE_DOMAIN = "gdnflow.deprecated_form"


def _check_model(onnx, model):
    """onnx's checker, but for the forms onnx marks deprecated in opsets that still
    define them (GroupNormalization-18 in opsets 18 to 20, Upsample-10, Scatter-11),
    which exporters wrote and gdnflow runs: the checker refuses them, so their nodes
    are set aside in a private domain (which it does not check) and the rest of
    the graph is checked; gdnflow's own rules (onnx_opsets, onnx_support) check them."""
    try:
        onnx.checker.check_model(model)
        return
    except onnx.checker.ValidationError as exc:
        if "is deprecated in domain_version" not in str(exc):
            raise
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for node, _ in _every_node(copy.graph):
        if (node.domain in ("", "ai.onnx") and node.op_type in HANDLERS and opset is not None
                and onnx.defs.get_schema(node.op_type, opset).deprecated):
            node.domain = _SET_ASIDE_DOMAIN
    copy.opset_import.append(onnx.helper.make_opsetid(_SET_ASIDE_DOMAIN, 1))
    onnx.checker.check_model(copy)


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
        self.opset = model_opset(model)
        problems = unsupported(graph, self.opset)
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
        constants = dict(initializers)
        self._nodes = []
        for node in graph.node:
            step = _Node(node, self.opset)
            branch = onnx_control.known_branch(step, constants)
            if branch:      # the other branch's values are not needed: only this one's
                step.keep_only(branch)
            if all(name in constants or name == "" for name in step.inputs) and step.foldable:
                run_steps([step], constants, self.device, f"{source}: ")
            else:
                self._nodes.append(step)
        # The float weights that nodes run at forward time read (or the graph
        # outputs) are parameters: initializers, and weights computed at load
        # (Constant nodes, ConstantOfShape fills, dequantised integer weights, a
        # branch of an If on shapes). What only folding read stays behind.
        float_inputs = {i.name for i in graph.input if i.name in self.input_names
                        and i.type.tensor_type.elem_type in _FLOAT_TYPES}
        steered = onnx_control.on_data(self._nodes, float_inputs | {
            name for name, value in constants.items() if _is_weight(value)})
        if steered:
            raise OnnxImportError(f"{source}: {'; '.join(steered)}")
        read_at_forward = {name for step in self._nodes for name in step.inputs}
        # A weight folded through Identity (how exporters write a tied weight) is
        # the same array under two names: one parameter. The arrays are kept
        # alive here so that their ids stay theirs.
        attribute_of_array = {}
        for name in [n for n in constants if n in read_at_forward or n in self.output_names]:
            if _is_weight(constants[name]):
                array = constants.pop(name)
                if id(array) not in attribute_of_array:
                    attribute_of_array[id(array)] = (array, self._add_parameter(array))
                self._parameter_of[name] = attribute_of_array[id(array)][1]
        self._constants = constants
        self.eval()     # an imported graph is for inference, as a Keras model's is

    def _add_parameter(self, array):
        """``array`` as a new (frozen) Parameter of this module; its attribute name."""
        attribute = f"param{len(set(self._parameter_of.values()))}"
        setattr(self, attribute, Parameter(array, device=self.device, requires_grad=False))
        return attribute

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
        run_steps(self._nodes, values, self.device, f"{self.source}: ")
        outputs = [values[n] for n in self.output_names]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def run_steps(steps, values, device, where=""):
    """Run ``steps`` (:class:`_Node`) in order, reading and adding to ``values``
    (ONNX value name -> tensor or host array); errors name the node, after ``where``."""
    for step in steps:
        try:
            results = step.run([values.get(n) if n else None for n in step.inputs], device)
        except Exception as exc:
            # Errors of _Node.fail name the node already; the others (as_tensor's
            # OnnxImportError, NumPy's, the operators') do not.
            named = f"node {step.name} ({step.op_type}): "
            message = str(exc) if str(exc).startswith(named) else named + str(exc)
            raise type(exc)(where + message) from exc
        for out, value in zip(step.outputs, results):
            values[out] = value


def model_opset(model):
    """The opset of the default ONNX domain that ``model`` (a ModelProto) imports
    (1, ONNX's first, where it imports none)."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def unsupported(graph, opset):
    """What of ``graph`` (an ONNX GraphProto of a model of ``opset``) gdnflow cannot
    run, as one line; "" if nothing.

    Every unsupported operator, those inside subgraphs (If branches, Loop and
    Scan bodies) included and named by their subgraph; the quantisation
    operators of a quantised graph, in a line of their own; every node whose
    form is not its version's in ``opset`` (:mod:`gdnflow.io.onnx_opsets`:
    an operator the opset lacks, a form older than opset 7, an attribute or
    input its version does not take); and every node's attribute, value or
    extra output that :mod:`gdnflow.io.onnx_support` does not list as runnable.
    """
    from onnx import helper     # local import: onnx is optional, loaded on first use
    missing, quantised, features = {}, {}, []
    for node, where in _every_node(graph):
        label = where + (node.name or "(unnamed)")
        if node.domain not in ("", "ai.onnx"):
            if custom_operator(node.domain, node.op_type) is None:
                missing.setdefault(f"{node.domain}.{node.op_type}", []).append(label)
        elif node.op_type in onnx_ops_quant.QUANTISED:
            quantised.setdefault(node.op_type, []).append(label)
        elif node.op_type not in HANDLERS:
            missing.setdefault(node.op_type, []).append(label)
        else:
            attributes = {a.name: _decoded(helper.get_attribute_value(a)) for a in node.attribute}
            found = version_problems(node.op_type, opset, list(attributes), len(node.input))
            if not found:
                found = unsupported_features(node.op_type, attributes, list(node.output))
            if found:
                features.append(f"node {where}{_node_name(node)} ({node.op_type}): "
                                f"{', '.join(found)} is not supported")
    listed = lambda found: "; ".join(  # noqa: E731
        f"{op} (nodes {', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
        for op, names in sorted(found.items()))
    if missing:
        features.insert(0, "unsupported ONNX operators: " + listed(missing))
    if quantised:
        features.insert(0, f"quantised graph: {listed(quantised)} is not supported; gdnflow runs "
                           "float32 models (DequantizeLinear of constant weights is dequantised "
                           "at load)")
    return "; ".join(features)


def _subgraphs(node):
    """(attribute name, GraphProto) of each subgraph of ``node`` (If branches, Loop bodies)."""
    return [(a.name, g) for a in node.attribute
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs)]


def _every_node(graph, where=""):
    """(node, where) for each node of ``graph`` and of its subgraphs, ``where``
    naming the subgraph ("loop1/body: ") or empty at the top level."""
    for node in graph.node:
        yield node, where
        for attribute, subgraph in _subgraphs(node):
            yield from _every_node(subgraph, f"{where}{_node_name(node)}/{attribute}: ")


def _outer_names(graph):
    """The values a subgraph reads from the scopes around it, in first-use order."""
    produced = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    outer = []
    for node in graph.node:
        for name in list(node.input) + [n for _, g in _subgraphs(node) for n in _outer_names(g)]:
            if name and name not in produced and name not in outer:
                outer.append(name)
        produced.update(node.output)
    outer += [v.name for v in graph.output if v.name not in produced and v.name not in outer]
    return outer


class _Subgraph:
    """A subgraph (an If branch, a Loop body): its nodes, constants, inputs and outputs."""

    def __init__(self, graph, opset):
        from onnx import numpy_helper   # local import: onnx is optional, loaded on first use
        self.constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self.input_names = [v.name for v in graph.input]
        self.output_names = [v.name for v in graph.output]
        self.outer_names = _outer_names(graph)
        self.steps = [_Node(node, opset) for node in graph.node]

    def run(self, values, device):
        """The subgraph's outputs, ``values`` holding its inputs and the outer values it reads."""
        values = {**values, **self.constants}
        run_steps(self.steps, values, device)
        return [values[name] for name in self.output_names]


class _Node:
    """One ONNX node: its attributes decoded once, run by its handler."""

    # Ops that may run on host arrays at import time when all inputs are known.
    HOST_OPS = (onnx_ops_core.HOST_OPS | onnx_ops.HOST_OPS | onnx_ops_math.HOST_OPS
                | onnx_ops_reduce.HOST_OPS | onnx_ops_index.HOST_OPS | onnx_ops_quant.HOST_OPS
                | onnx_control.HOST_OPS)

    def __init__(self, node, opset):
        from onnx import helper     # local import: onnx is optional, loaded on first use
        self.op_type = node.op_type
        self.domain = node.domain if node.domain not in ("", "ai.onnx") else ""
        self.name = _node_name(node)
        self.outputs = list(node.output)
        self.opset = opset
        self.attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute
                      if not (a.HasField("g") or a.graphs)}
        self.subgraphs = {name: _Subgraph(graph, opset) for name, graph in _subgraphs(node)}
        # The outer values its subgraphs read are inputs too, after the declared
        # ones: so the node runs after them, and folds at load when they are constants.
        self.declared = len(node.input)
        self.inputs = list(node.input)
        self.keep_only(*self.subgraphs)

    def keep_only(self, *names):
        """Keep the subgraphs ``names`` only (an If's taken branch), and as inputs
        after the declared ones the outer values they read."""
        self.subgraphs = {name: self.subgraphs[name] for name in names}
        self.captured = list(dict.fromkeys(
            name for subgraph in self.subgraphs.values() for name in subgraph.outer_names))
        self.inputs = self.inputs[:self.declared] + self.captured
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
        # NumPy arithmetic on 0-d arrays gives scalars: host values stay arrays.
        return [np.asarray(v) if isinstance(v, np.generic) else v
                for v in (result if isinstance(result, (list, tuple)) else [result])]


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
#: ONNX TensorProto types of float data (float, float16, double, bfloat16).
_FLOAT_TYPES = {1, 10, 11, 16}


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
            **onnx_ops_reduce.HANDLERS, **onnx_ops_index.HANDLERS, **onnx_ops_rnn.HANDLERS,
            **onnx_ops_quant.HANDLERS, **onnx_control.HANDLERS}
