"""A MobileNetV2 ONNX file with random weights, laid out as torch.onnx exports torchvision's.

Batch norm folded into each convolution's bias, ReLU6 as ``Clip`` with its
bounds in ``Constant`` nodes (as exporters write opset 11+), a residual
``Add`` where the block keeps its shape, then ``GlobalAveragePool``,
``Flatten`` and ``Gemm``. Built here with ``onnx.helper`` so the tests need
no file from outside the checkout and no PyTorch; onnxruntime is the reference.
"""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

#: torchvision's MobileNetV2 blocks: expansion t, output channels c, repeats n, first stride s.
BLOCKS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
          (6, 160, 3, 2), (6, 320, 1, 1))


class _Graph:
    """Nodes and initializers of the graph being built, with fresh names."""

    def __init__(self, rng):
        self.rng, self.nodes, self.weights, self.count = rng, [], [], 0

    def name(self, kind):
        self.count += 1
        return f"{kind}_{self.count}"

    def weight(self, array):
        name = self.name("onnx::Conv")
        self.weights.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def conv(self, x, c_in, c_out, kernel=1, stride=1, groups=1, relu6=True):
        # He initialisation keeps the activations of a random network in range.
        fan_in = c_in // groups * kernel * kernel
        w = self.rng.standard_normal((c_out, c_in // groups, kernel, kernel)) * np.sqrt(2 / fan_in)
        b = 0.1 * self.rng.standard_normal(c_out)
        y = self.name("conv")
        self.nodes.append(helper.make_node(
            "Conv", [x, self.weight(w), self.weight(b)], [y], name=self.name("Conv"),
            kernel_shape=[kernel, kernel], strides=[stride, stride], group=groups,
            pads=[kernel // 2] * 4, dilations=[1, 1]))
        return self.clip(y) if relu6 else y

    def clip(self, x):
        bounds = []
        for value in (0.0, 6.0):
            bounds.append(self.name("constant"))
            self.nodes.append(helper.make_node(
                "Constant", [], [bounds[-1]], name=self.name("Constant"),
                value=numpy_helper.from_array(np.array(value, np.float32))))
        y = self.name("clip")
        self.nodes.append(helper.make_node("Clip", [x, *bounds], [y], name=self.name("Clip")))
        return y

    def node(self, op_type, inputs, **attributes):
        y = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [y], name=self.name(op_type),
                                           **attributes))
        return y


def mobilenet_v2_onnx(path, seed=0, classes=1000):
    """Write a MobileNetV2 (3.5 million parameters) with random weights to ``path``."""
    g = _Graph(np.random.default_rng(seed))
    x = g.conv("input", 3, 32, kernel=3, stride=2)
    channels = 32
    for t, c, n, s in BLOCKS:
        for i in range(n):
            stride, hidden = s if i == 0 else 1, channels * t
            y = g.conv(x, channels, hidden) if t != 1 else x
            y = g.conv(y, hidden, hidden, kernel=3, stride=stride, groups=hidden)
            y = g.conv(y, hidden, c, relu6=False)
            x = g.node("Add", [x, y]) if stride == 1 and channels == c else y
            channels = c
    x = g.conv(x, channels, 1280)
    x = g.node("Flatten", [g.node("GlobalAveragePool", [x])], axis=1)
    w = g.rng.standard_normal((classes, 1280)) / np.sqrt(1280)
    x = g.node("Gemm", [x, g.weight(w), g.weight(0.01 * g.rng.standard_normal(classes))],
               alpha=1.0, beta=1.0, transB=1)
    graph = helper.make_graph(
        g.nodes, "mobilenet_v2",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 224, 224])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, classes])], g.weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="gdnflow tests")
    model.ir_version = 8
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path
