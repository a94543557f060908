"""Tracing (gdnflow.inference.tracing): output structure, constants made inside forward."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import inference, nn, ops
from gdnflow.inference import InferencePlan
from gdnflow.nn.module import Module
from inference_models import tensor


class Pair(Module):
    def __init__(self, rng):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 1, rng=rng)

    def forward(self, x):
        y = self.conv(x)
        return y, ops.relu(y)


def test_tuple_outputs_keep_their_structure(rng):
    model = Pair(rng).to("numpy").eval()
    x = tensor(rng, (1, 2, 3, 3))
    a, b = inference.compile(model)(x)
    np.testing.assert_allclose(b.numpy(), np.maximum(a.numpy(), 0))


class MakesConstant(Module):
    def forward(self, x):
        return x * gf.tensor(np.full(x.shape, 2.0), device=x.device)


def test_tensor_made_inside_forward_is_frozen_with_a_warning(rng):
    x = tensor(rng, (2, 3))
    with pytest.warns(UserWarning, match="frozen into the plan as constants"):
        plan = InferencePlan(MakesConstant().eval(), x.shape, device="numpy")
    np.testing.assert_allclose(plan(x).numpy(), 2 * x.numpy())
