"""ONNX's recurrent operators (gdnflow/io/onnx_ops_rnn.py): gradients through the
imported module, and the attributes the onnx node cases leave out against onnxruntime
(the node cases themselves run in test_onnx.py)."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import gdnflow as gf  # noqa: E402
from gdnflow.io.onnx import OnnxImportError, OnnxModule  # noqa: E402
from gdnflow.testing import assert_backends_match, gradcheck  # noqa: E402
from onnx_graphs import graph_model, node  # noqa: E402

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def recurrent_model(op_type, steps=3, batch=2, size=3, hidden=2, directions=1, outputs=None,
                    extra_inputs=(), **attributes):
    """One recurrent node; X, W, R and B are graph inputs ([B, S, I] with layout=1)."""
    gates = GATES[op_type]
    x_shape = (batch, steps, size) if attributes.get("layout") else (steps, batch, size)
    inputs = {"x": x_shape, "w": (directions, gates * hidden, size),
              "r": (directions, gates * hidden, hidden), "b": (directions, 2 * gates * hidden)}
    inputs.update(extra_inputs)
    outputs = outputs or (["y", "y_h", "y_c"] if op_type == "LSTM" else ["y", "y_h"])
    # sequence_lens (input 4) left out; then initial_h, initial_c, P in that order.
    names = ["x", "w", "r", "b"] + (["", *extra_inputs] if extra_inputs else [])
    return graph_model([node(op_type, names, outputs, hidden_size=hidden, **attributes)],
                       inputs, {name: None for name in outputs}, opset=14)


GRADIENT_CASES = {
    "RNN, clip": ("RNN", {}, dict(clip=0.8)),
    "GRU bidirectional, linear_before_reset": ("GRU", {}, dict(direction="bidirectional",
                                                              linear_before_reset=1)),
    "GRU, reverse": ("GRU", {}, dict(direction="reverse")),
    "LSTM, initial states and peepholes": ("LSTM", {"h0": (1, 2, 2), "c0": (1, 2, 2),
                                                    "p": (1, 6)}, {}),
}


def every_output(model, devices):
    """The model's outputs flattened and joined, run by its module on the inputs' device;
    with random inputs (scaled by 0.7) for each graph input."""
    modules = {device: OnnxModule(model, device=device) for device in devices}

    def joined(*inputs):
        return gf.ops.concat([gf.ops.reshape(v, (v.size,)) for v in modules[inputs[0].device](*inputs)])
    shapes = [tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in model.graph.input]
    return joined, shapes


@pytest.mark.parametrize("op_type, extra, attributes", GRADIENT_CASES.values(),
                         ids=GRADIENT_CASES.keys())
def test_gradients_through_a_recurrent_node(op_type, extra, attributes, rng):
    directions = 2 if attributes.get("direction") == "bidirectional" else 1
    model = recurrent_model(op_type, directions=directions, extra_inputs=extra, **attributes)
    joined, shapes = every_output(model, ["numpy"])
    gradcheck(joined, [rng.standard_normal(shape) * 0.7 for shape in shapes])


@pytest.mark.gpu
@pytest.mark.parametrize("op_type, extra, attributes", GRADIENT_CASES.values(),
                         ids=GRADIENT_CASES.keys())
def test_recurrent_node_on_cuda_matches_numpy(op_type, extra, attributes, rng):
    directions = 2 if attributes.get("direction") == "bidirectional" else 1
    model = recurrent_model(op_type, directions=directions, extra_inputs=extra, **attributes)
    joined, shapes = every_output(model, ["numpy", "cuda"])
    assert_backends_match(joined, [rng.standard_normal(shape) * 0.7 for shape in shapes],
                          rtol=1e-4)


ONNXRUNTIME_CASES = {
    "LSTM bidirectional, initial states": (
        "LSTM", {"h0": (2, 2, 2), "c0": (2, 2, 2)}, dict(direction="bidirectional")),
    "LSTM, input_forget, clip, peepholes": ("LSTM", {"h0": (1, 2, 2), "c0": (1, 2, 2),
                                                     "p": (1, 6)}, dict(input_forget=1, clip=0.5)),
    "GRU, linear_before_reset, Relu and HardSigmoid": (
        "GRU", {}, dict(linear_before_reset=1, activations=["HardSigmoid", "Relu"])),
    "RNN bidirectional, Softsign and Relu": ("RNN", {}, dict(direction="bidirectional",
                                                             activations=["Softsign", "Relu"])),
}


@pytest.mark.parametrize("op_type, extra, attributes", ONNXRUNTIME_CASES.values(),
                         ids=ONNXRUNTIME_CASES.keys())
def test_recurrent_node_matches_onnxruntime(op_type, extra, attributes, rng):
    ort = pytest.importorskip("onnxruntime")
    directions = 2 if attributes.get("direction") == "bidirectional" else 1
    model = recurrent_model(op_type, steps=4, batch=2, size=3, hidden=2, directions=directions,
                            extra_inputs=extra, **attributes)
    feeds = {v.name: rng.standard_normal([d.dim_value for d in v.type.tensor_type.shape.dim])
             .astype(np.float32) for v in model.graph.input}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    got = OnnxModule(model, device="numpy")(*feeds.values())
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        np.testing.assert_allclose(g.numpy(), e, rtol=1e-5, atol=1e-6)


def test_batch_first_layout_is_the_transposed_sequence_layout(rng):
    """onnxruntime refuses layout=1 (the node cases cover it without initial states)."""
    extra = {"h0": (2, 2, 2), "c0": (2, 2, 2)}
    batch_first = OnnxModule(recurrent_model("LSTM", directions=2, extra_inputs=extra, layout=1,
                                             direction="bidirectional"), device="numpy")
    sequence_first = OnnxModule(recurrent_model("LSTM", directions=2, extra_inputs=extra,
                                                direction="bidirectional"), device="numpy")
    x, w, r, b, h0, c0 = [rng.standard_normal(s).astype(np.float32) for s in (
        (2, 3, 3), (2, 8, 3), (2, 8, 2), (2, 16), (2, 2, 2), (2, 2, 2))]
    swap = (1, 0, 2)
    y, y_h, y_c = batch_first(x, w, r, b, h0, c0)
    y0, y0_h, y0_c = sequence_first(x.transpose(swap), w, r, b, h0.transpose(swap),
                                    c0.transpose(swap))
    np.testing.assert_allclose(y.numpy(), y0.numpy().transpose(2, 0, 1, 3), rtol=1e-6)
    np.testing.assert_allclose(y_h.numpy(), y0_h.numpy().transpose(swap), rtol=1e-6)
    np.testing.assert_allclose(y_c.numpy(), y0_c.numpy().transpose(swap), rtol=1e-6)


def test_sequence_lens_shorter_than_the_sequence_is_refused(rng):
    model = recurrent_model("GRU")
    model.graph.node[0].input.append("lengths")
    model.graph.input.append(onnx.helper.make_tensor_value_info("lengths", onnx.TensorProto.INT32,
                                                                [2]))
    inputs = [rng.standard_normal([d.dim_value for d in v.type.tensor_type.shape.dim])
              .astype(np.float32) for v in model.graph.input[:4]]
    module = OnnxModule(model, device="numpy")
    assert module(*inputs, np.array([3, 3], np.int32))[1].shape == (1, 2, 2)
    with pytest.raises(OnnxImportError, match=r"sequence_lens \[3, 1\] shorter than the sequence "
                                              r"\(3 steps"):
        module(*inputs, np.array([3, 1], np.int32))


def test_activation_parameters_are_refused_at_load():
    model = recurrent_model("RNN", activations=["LeakyRelu"], activation_alpha=[0.2])
    with pytest.raises(OnnxImportError, match=r"activation_alpha=\[0.2\w*\] \(parameterised "
                                              r"activations run with ONNX's defaults\)"):
        OnnxModule(model, device="numpy")
