"""The operator registry: built-ins and plugins register the same way."""
import pytest

from gdnflow import registry
from gdnflow.autograd import Operator


def test_builtins_are_registered():
    names = registry.names()
    for name in ["add", "sub", "mul", "div", "neg", "exp", "log", "sqrt", "pow", "relu", "relu6",
                 "sigmoid", "clamp", "reshape", "sum", "mean"]:
        assert name in names
    assert registry.get("relu").op_name == "relu"


def test_name_clash_is_an_error_unless_replace():
    with pytest.raises(ValueError, match=r"operator name 'relu' is taken by gdnflow.ops.elementwise.ReLU"):
        @registry.register("relu")
        class MyReLU(Operator):
            pass
    original = registry.get("relu")
    try:
        @registry.register("relu", replace=True)
        class MyReLU2(Operator):
            pass
        assert registry.get("relu") is MyReLU2
    finally:
        registry.register("relu", replace=True)(original)


def test_unknown_name_lists_registered():
    with pytest.raises(KeyError, match="no operator named 'nope'"):
        registry.get("nope")
