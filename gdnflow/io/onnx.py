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

from gdnflow import ops, registry
from gdnflow.backends import default_device
from gdnflow.io import onnx_ops, onnx_ops_index, onnx_ops_math, onnx_ops_reduce
from gdnflow.io.onnx_support import ONNX_TYPES, unsupported_features
from gdnflow.io.onnx_values import OnnxImportError, as_tensor, host, ints, is_host, scalar
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
    HOST_OPS = ({"Shape", "Gather", "Slice", "Cast", "Constant", "ConstantOfShape", "Concat",
                 "Unsqueeze", "Squeeze", "Reshape", "Identity", "Add", "Sub", "Mul", "Div",
                 "Transpose", "Flatten"} | onnx_ops.HOST_OPS | onnx_ops_math.HOST_OPS
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
    """An attribute value with bytes (ONNX strings) as str."""
    return value.decode() if isinstance(value, bytes) else value


def _spatial_2d(node, x):
    if x.ndim != 4:
        node.fail(f"a {x.ndim - 2}-D {node.op_type} (only 2-D, NCHW)")


def _pads_2d(node, x_shape, kernel, strides, dilations=(1, 1)):
    """(top, bottom, left, right) from ONNX pads or auto_pad."""
    auto_pad = node.attr("auto_pad", "NOTSET")
    if auto_pad in ("NOTSET", "VALID"):
        pads = node.attr("pads", [0, 0, 0, 0]) if auto_pad == "NOTSET" else [0, 0, 0, 0]
        return (pads[0], pads[2], pads[1], pads[3])
    out = []
    for size, k, s, d in zip(x_shape[2:], kernel, strides, dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, large = total // 2, total - total // 2
        out.append((small, large) if auto_pad == "SAME_UPPER" else (large, small))
    return (out[0][0], out[0][1], out[1][0], out[1][1])


def _binary(function, host_function):
    def handler(node, inputs, device):
        a, b = inputs
        if is_host(a) and is_host(b):
            return host_function(a, b)
        if is_host(b) and b.size == 1:
            return function(a, float(b.reshape(())))
        if is_host(a) and a.size == 1:
            return function(float(a.reshape(())), b)
        return function(as_tensor(a, device), as_tensor(b, device))
    return handler


# -------------------------------------------------------------- handlers --
def _conv(node, inputs, device):
    x, w, b = (inputs + [None])[:3]
    _spatial_2d(node, x)
    strides = node.attr("strides", [1, 1])
    dilations = node.attr("dilations", [1, 1])
    kernel = node.attr("kernel_shape", list(w.shape[2:]))
    padding = _pads_2d(node, x.shape, kernel, strides, dilations)
    return ops.conv2d(x, as_tensor(w, device), None if b is None else as_tensor(b, device),
                      stride=strides, padding=padding, dilation=dilations,
                      groups=node.attr("group", 1))


def _conv_transpose(node, inputs, device):
    x, w, b = (inputs + [None])[:3]
    _spatial_2d(node, x)
    pads = node.attr("pads", [0, 0, 0, 0])
    return ops.conv_transpose2d(x, as_tensor(w, device),
                                None if b is None else as_tensor(b, device),
                                stride=node.attr("strides", [1, 1]),
                                padding=(pads[0], pads[2], pads[1], pads[3]),
                                output_padding=node.attr("output_padding", [0, 0]),
                                dilation=node.attr("dilations", [1, 1]),
                                groups=node.attr("group", 1))


def _gemm(node, inputs, device):
    a, b, c = (inputs + [None])[:3]
    a, b = as_tensor(a, device), as_tensor(b, device)
    if node.attr("transA", 0):
        a = ops.transpose(a, (1, 0))
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    w = b if node.attr("transB", 0) else ops.transpose(b, (1, 0))   # linear takes [out, in]
    y = ops.linear(a, w)
    if alpha != 1.0:
        y = y * alpha
    if c is not None:
        c = as_tensor(c, device)
        y = y + (c * beta if beta != 1.0 else c)
    return y


def _matmul(node, inputs, device):
    return ops.matmul(as_tensor(inputs[0], device), as_tensor(inputs[1], device))


def _clip(node, inputs, device):
    x = inputs[0]
    if node.opset < 11:
        low, high = node.attr("min", -np.inf), node.attr("max", np.inf)
    else:
        low = scalar(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else -np.inf
        high = scalar(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else np.inf
    if low > high:
        low = high      # ONNX: with min > max every output is max
    if low == 0 and high == 6:
        return ops.relu6(x)
    if low == 0 and high == np.inf:
        return ops.relu(x)
    return ops.clamp(x, max(low, -3.4e38), min(high, 3.4e38))


def _batch_norm(node, inputs, device):
    x, scale, bias, mean, var = inputs[:5]
    t = lambda v: as_tensor(v, device)  # noqa: E731
    return ops.batch_norm(x, t(scale), t(bias), t(mean), t(var), training=False,
                          eps=node.attr("epsilon", 1e-5))


def _pool_geometry(node, x):
    _spatial_2d(node, x)
    kernel = node.attr("kernel_shape")
    strides = node.attr("strides", [1, 1])
    return kernel, strides, _pads_2d(node, x.shape, kernel, strides)


def _max_pool(node, inputs, device):
    kernel, strides, padding = _pool_geometry(node, inputs[0])
    return ops.max_pool2d(inputs[0], kernel, strides, padding)


def _average_pool(node, inputs, device):
    kernel, strides, padding = _pool_geometry(node, inputs[0])
    return ops.avg_pool2d(inputs[0], kernel, strides, padding,
                          count_include_pad=bool(node.attr("count_include_pad", 0)))


def _flatten(node, inputs, device):
    x = inputs[0]
    axis = node.attr("axis", 1) % max(len(x.shape), 1) if x.shape else 0
    shape = (int(np.prod(x.shape[:axis], dtype=np.int64)), -1)
    return x.reshape(shape) if is_host(x) else ops.reshape(x, shape)


def _reshape(node, inputs, device):
    x, shape = inputs
    shape = ints(shape)
    if not node.attr("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape) if is_host(x) else ops.reshape(x, shape)


def _transpose(node, inputs, device):
    x = inputs[0]
    perm = node.attr("perm", list(range(len(x.shape)))[::-1])
    return np.transpose(x, perm).copy() if is_host(x) else ops.transpose(x, perm)


def _axes(node, inputs, ndim):
    axes = node.attr("axes") if node.opset < 13 else (
        ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None)
    return None if axes is None else sorted(a % ndim for a in axes)


def _squeeze(node, inputs, device):
    x = inputs[0]
    axes = _axes(node, inputs, len(x.shape))
    if axes is None:
        axes = [i for i, s in enumerate(x.shape) if s == 1]
    if any(x.shape[a] != 1 for a in axes):
        node.fail(f"squeezing a dimension larger than 1 (shape {tuple(x.shape)}, axes {axes})")
    shape = [s for i, s in enumerate(x.shape) if i not in axes]
    return x.reshape(shape) if is_host(x) else ops.reshape(x, shape)


def _unsqueeze(node, inputs, device):
    x = inputs[0]
    raw = node.attr("axes") if node.opset < 13 else ints(inputs[1])
    ndim = len(x.shape) + len(raw)
    shape = list(x.shape)
    for axis in sorted(a % ndim for a in raw):
        shape.insert(axis, 1)
    return x.reshape(shape) if is_host(x) else ops.reshape(x, shape)


def _concat(node, inputs, device):
    axis = node.attr("axis")
    present = [v for v in inputs if v is not None and np.prod(v.shape) > 0] or inputs[:1]
    if all(is_host(v) for v in present):
        return np.concatenate(present, axis=axis)
    return ops.concat([as_tensor(v, device) for v in present], axis=axis)


def _pad(node, inputs, device):
    x = inputs[0]
    if node.opset < 11:
        pads, value = node.attr("pads"), node.attr("value", 0.0)
    else:
        pads = ints(inputs[1])
        value = scalar(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else 0.0
        if len(inputs) > 3 and inputs[3] is not None:
            node.fail("the axes input")
    half = len(pads) // 2
    pairs = list(zip(pads[:half], pads[half:]))
    if any(b < 0 or a < 0 for b, a in pairs):
        node.fail("negative pads (cropping)")
    return ops.pad(x, pairs, value)


def _dropout(node, inputs, device):
    if len(inputs) > 2 and inputs[2] is not None and bool(host(inputs[2]).reshape(())):
        node.fail("Dropout in training mode")
    if len(node.outputs) > 1 and node.outputs[1]:
        # Inference keeps every element: the mask is all true.
        return [inputs[0], np.ones(inputs[0].shape, dtype=np.bool_)]
    return inputs[0]


def _shape(node, inputs, device):
    shape = np.array(inputs[0].shape, dtype=np.int64)
    start, end = node.attr("start", 0), node.attr("end", None)
    return shape[start:end]


def _gather(node, inputs, device):
    data, indices = inputs
    axis = node.attr("axis", 0) % len(data.shape)
    indices = host(indices).astype(np.int64)
    if is_host(data):
        return np.take(data, indices, axis=axis)
    # On a device tensor: one slice per index, joined (Gather there is rare:
    # exporters use it on shapes; this path is for correctness, not speed).
    size = data.shape[axis]
    flat = [int(i) % size for i in indices.reshape(-1)]
    lead = [slice(None)] * axis
    pieces = [ops.slice_(data, tuple(lead + [slice(i, i + 1)])) for i in flat]
    joined = ops.concat(pieces, axis=axis) if len(pieces) != 1 else pieces[0]
    return ops.reshape(joined, data.shape[:axis] + indices.shape + data.shape[axis + 1:])


def _slice(node, inputs, device):
    x = inputs[0]
    if node.opset < 10:
        starts, ends = node.attr("starts"), node.attr("ends")
        axes, steps = node.attr("axes"), None
    else:
        starts, ends = ints(inputs[1]), ints(inputs[2])
        axes = ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else None
        steps = ints(inputs[4]) if len(inputs) > 4 and inputs[4] is not None else None
    ndim = len(x.shape)
    axes = list(range(len(starts))) if axes is None else [a % ndim for a in axes]
    steps = steps or [1] * len(starts)
    index = [slice(None)] * ndim
    for axis, start, end, step in zip(axes, starts, ends, steps):
        # ONNX clamps out-of-range ends (e.g. INT64_MAX), as Python slices do.
        index[axis] = slice(start, None if (step < 0 and end < -x.shape[axis]) else end, step)
    if is_host(x):
        return x[tuple(index)].copy()
    return ops.slice_(x, tuple(index))


def _cast(node, inputs, device):
    x = inputs[0]
    to = ONNX_TYPES[node.attr("to")]
    if is_host(x):
        return x.astype(to)
    if np.dtype(to) != np.float32:
        node.fail(f"casting a device tensor to {np.dtype(to)} (device tensors are float32)")
    return x


def _constant(node, inputs, device):
    from onnx import numpy_helper   # local import: onnx is optional, loaded on first use
    if "value" in node.attrs:
        return numpy_helper.to_array(node.attrs["value"])
    for key, dtype in (("value_float", np.float32), ("value_int", np.int64),
                       ("value_floats", np.float32), ("value_ints", np.int64)):
        if key in node.attrs:
            return np.array(node.attrs[key], dtype=dtype)
    node.fail("this kind of Constant value")


def _constant_of_shape(node, inputs, device):
    from onnx import numpy_helper   # local import: onnx is optional, loaded on first use
    value = node.attrs.get("value")
    fill = numpy_helper.to_array(value) if value is not None else np.zeros(1, np.float32)
    return np.full(ints(inputs[0]), fill.reshape(-1)[0], dtype=fill.dtype)


HANDLERS = {
    "Conv": _conv, "ConvTranspose": _conv_transpose, "Gemm": _gemm, "MatMul": _matmul,
    "Add": _binary(ops.add, np.add), "Sub": _binary(ops.sub, np.subtract),
    "Mul": _binary(ops.mul, np.multiply),
    "Div": _binary(ops.div, lambda a, b: (np.trunc(np.true_divide(a, b))   # integers truncate
                                          if a.dtype.kind in "iu" and b.dtype.kind in "iu"
                                          else np.divide(a, b)).astype(np.result_type(a, b))),
    "Relu": onnx_ops.unary(ops.relu), "Sigmoid": onnx_ops.unary(ops.sigmoid), "Clip": _clip,
    "BatchNormalization": _batch_norm, "MaxPool": _max_pool, "AveragePool": _average_pool,
    "GlobalAveragePool": lambda node, inputs, device: ops.global_avg_pool2d(inputs[0]),
    "Flatten": _flatten, "Reshape": _reshape, "Transpose": _transpose, "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze, "Concat": _concat, "Pad": _pad, "Softmax": onnx_ops_math.softmax_handler(lambda x, axis: ops.softmax(x, axis=axis)),
    "Dropout": _dropout, "Identity": lambda node, inputs, device: inputs[0],
    "Shape": _shape, "Gather": _gather, "Slice": _slice, "Cast": _cast, "Constant": _constant,
    "ConstantOfShape": _constant_of_shape, **onnx_ops.HANDLERS, **onnx_ops_math.HANDLERS,
    **onnx_ops_reduce.HANDLERS, **onnx_ops_index.HANDLERS,
}
