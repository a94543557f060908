"""Module: parameters, submodules, buffers, state_dict round trips, modes, devices."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow.nn import Module, Parameter


class Scale(Module):
    """y = weight * x + shift, with a buffer counting nothing in particular."""

    def __init__(self, n):
        super().__init__()
        self.weight = Parameter(np.arange(n, dtype=np.float32), device="numpy")
        self.register_buffer("shift", np.full(n, 0.5))
        self.register_buffer("unused", None)

    def forward(self, x):
        return x * self.weight + self.shift


class Net(Module):
    def __init__(self):
        super().__init__()
        self.first = Scale(3)
        self.bias = Parameter(np.zeros(3), device="numpy")
        self.second = Scale(3)


def test_buffers_are_registered_but_not_parameters():
    net = Net()
    assert [n for n, _ in net.named_parameters()] == ["bias", "first.weight", "second.weight"]
    assert [n for n, _ in net.named_buffers()] == ["first.shift", "second.shift"]
    assert all(not b.requires_grad for b in net.buffers())
    assert isinstance(net.first.shift, gf.Tensor)
    np.testing.assert_array_equal(net.first.shift.numpy(), [0.5, 0.5, 0.5])


def test_state_dict_lists_parameters_then_buffers_module_by_module():
    # PyTorch's order: a module's parameters, its buffers, then its submodules.
    state = Net().state_dict()
    assert list(state) == ["bias", "first.weight", "first.shift", "second.weight",
                           "second.shift"]
    assert all(isinstance(v, np.ndarray) for v in state.values())


def test_state_dict_copies_and_load_state_dict_restores_buffers():
    net = Net()
    state = net.state_dict()
    state["first.shift"][:] = 7          # a copy: the module is untouched
    assert net.first.shift.numpy()[0] == 0.5
    other = Net()
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.first.shift.numpy(), [7, 7, 7])
    assert other.first.shift.dtype == np.float32 and other.first.shift.device == "numpy"
    assert other.first._buffers["shift"] is other.first.shift
    state["first.shift"][:] = 9          # loaded as a copy too
    assert other.first.shift.numpy()[0] == 7


def test_load_state_dict_names_missing_buffers_and_wrong_shapes():
    net = Net()
    state = net.state_dict()
    del state["second.shift"]
    state["extra"] = np.zeros(1)
    with pytest.raises(KeyError, match=r"missing \['second.shift'\], unexpected \['extra'\]"):
        net.load_state_dict(state)
    state = net.state_dict()
    state["first.shift"] = np.zeros(4)
    with pytest.raises(gf.ShapeError, match=r"first.shift: expected \(3,\), got \(4,\)"):
        net.load_state_dict(state)
    np.testing.assert_array_equal(net.first.shift.numpy(), [0.5] * 3)   # unchanged


def test_register_buffer_copies_arrays_and_keeps_tensors():
    array = np.ones(2, np.float32)
    module = Module()
    module.register_buffer("a", array)
    array[0] = 5
    assert module.a.numpy()[0] == 1
    t = gf.tensor([1.0, 2.0], device="numpy")
    module.register_buffer("b", t)
    assert module.b is t


def test_assigning_to_a_buffer_replaces_it_and_none_drops_it_from_state():
    module = Scale(2)
    module.shift = gf.tensor([3.0, 4.0], device="numpy")
    np.testing.assert_array_equal(module.state_dict()["shift"], [3, 4])
    module.unused = gf.tensor([1.0], device="numpy")
    assert "unused" in module.state_dict()
    module.shift = None
    assert "shift" not in module.state_dict()


@pytest.mark.parametrize("value, error, message", [
    (np.zeros(2), TypeError, r"Scale.shift is a buffer: assign a Tensor or None, got ndarray"),
    (Parameter(np.zeros(2), device="numpy"), TypeError, r"Scale.shift is a buffer"),
])
def test_assigning_a_non_tensor_to_a_buffer_is_refused(value, error, message):
    with pytest.raises(error, match=message):
        Scale(2).shift = value


def test_register_buffer_refuses_bad_names_and_clashes():
    module = Scale(2)
    with pytest.raises(KeyError, match="bad buffer name 'a.b'"):
        module.register_buffer("a.b", np.zeros(1))
    with pytest.raises(KeyError, match="'weight' is already a parameter or submodule"):
        module.register_buffer("weight", np.zeros(1))
    with pytest.raises(TypeError, match="is a Parameter"):
        module.register_buffer("p", Parameter(np.zeros(1), device="numpy"))


def test_register_buffer_before_init_says_so():
    class Broken(Module):
        def __init__(self):
            self.register_buffer("x", np.zeros(1))
    with pytest.raises(AttributeError, match=r"must call super\(\).__init__\(\)"):
        Broken()


def test_train_and_eval_reach_every_submodule():
    net = Net().eval()
    assert not net.training and not net.first.training and not net.second.training
    net.train()
    assert net.second.training


def test_to_same_device_keeps_the_tensors():
    net = Net()
    shift, weight = net.first.shift, net.first.weight
    net.to("numpy")
    assert net.first.shift is shift and net.first.weight is weight


@pytest.mark.gpu
def test_to_moves_parameters_and_buffers():
    net = Net().to("cuda")
    assert all(t.device == "cuda" for t in net.parameters() + net.buffers())
    assert net.first.weight.requires_grad and not net.first.shift.requires_grad
    y = net.first(gf.tensor(np.ones(3), device="cuda"))
    np.testing.assert_allclose(y.numpy(), [0.5, 1.5, 2.5])
    state = net.state_dict()
    assert list(state) == ["bias", "first.weight", "first.shift", "second.weight",
                           "second.shift"]
    net.to("numpy")
    assert all(t.device == "numpy" for t in net.parameters() + net.buffers())
    np.testing.assert_array_equal(net.first.shift.numpy(), [0.5] * 3)


def test_to_and_load_state_dict_keep_parameter_objects_for_optimisers():
    from gdnflow.nn.layers import Linear
    from gdnflow.optim import SGD
    layer = Linear(3, 2, rng=np.random.default_rng(0))
    weight = layer.weight
    optimizer = SGD(layer.parameters(), lr=0.1)
    layer.to("numpy")
    new_weight = np.ones((2, 3), np.float32)
    layer.load_state_dict({"weight": new_weight, "bias": np.zeros(2, np.float32)})
    assert layer.weight is weight
    layer(gf.tensor(np.ones((1, 3)), device="numpy")).sum().backward()
    optimizer.step()
    np.testing.assert_allclose(layer.weight.numpy(), new_weight - 0.1)   # dL/dW = 1
    np.testing.assert_array_equal(new_weight, np.ones((2, 3)))           # caller's array untouched
