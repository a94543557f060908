"""Small ONNX graphs built with onnx.helper, for the importer's tests (import after
``pytest.importorskip("onnx")``)."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper


def graph_model(nodes, inputs, outputs, initializers=(), opset=17):
    """A model of ``nodes``; ``inputs`` and ``outputs`` map float tensor names to shapes."""
    value = lambda name, shape: helper.make_tensor_value_info(  # noqa: E731
        name, TensorProto.FLOAT, shape)
    graph = helper.make_graph(
        nodes, "g", [value(n, s) for n, s in inputs.items()],
        [value(n, s) for n, s in outputs.items()],
        initializer=[numpy_helper.from_array(np.asarray(a), n) for n, a in dict(initializers).items()])
    # The least IR version the opset needs, not onnx's newest: an onnxruntime older
    # than the onnx package (the GPU machine's) refuses IR versions it does not know.
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets,
                             ir_version=max(helper.find_min_ir_version_for(opsets), 7))


def node(op_type, inputs, outputs=("y",), **attributes):
    """One ONNX node (``inputs`` a list of names, or a string of one-letter names)."""
    return helper.make_node(op_type, list(inputs), list(outputs), **attributes)
