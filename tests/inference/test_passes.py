"""Rewrite passes (gdnflow.inference.passes): constant and batch-norm folding, residual and
activation fusion, and what they must leave alone; each plan checked against the eager model."""
import pytest

from gdnflow import models, nn, ops
from gdnflow.inference import InferencePlan
from gdnflow.nn.module import Module
from gdnflow.testing import relative_error
from inference_models import Residual, eager, randomize_batch_norms, tensor


@pytest.mark.parametrize("bias,groups", [(True, 1), (False, 1), (False, 4)])
def test_batch_norm_folds_into_the_convolution_and_matches_eval_forward(bias, groups, rng):
    model = nn.Sequential(nn.Conv2d(4, 8 if groups == 1 else 4, 3, padding=1, groups=groups,
                                    bias=bias, rng=rng),
                          nn.BatchNorm2d(8 if groups == 1 else 4)).to("numpy")
    randomize_batch_norms(model, rng).eval()
    x = tensor(rng, (3, 4, 7, 6))
    plan = InferencePlan(model, x.shape)
    assert plan.stats["folded_batch_norm"] == 1 and plan.stats["steps"] == 1
    assert relative_error(plan(x).numpy(), eager(model, x)) < 1e-5


def test_residual_and_activation_fuse_after_the_fold(rng):
    model = randomize_batch_norms(Residual(6, rng).to("numpy"), rng).eval()
    x = tensor(rng, (2, 6, 5, 5))
    plan = InferencePlan(model, x.shape)
    assert plan.stats["steps"] == 1
    assert plan.program.steps[0].fused == ("batch_norm", "residual", "relu")
    assert relative_error(plan(x).numpy(), eager(model, x)) < 1e-5


def test_mobilenet_v2_program_is_folded_fused_and_equal_to_the_model(rng):
    model = models.mobilenet_v2(num_classes=10, width_mult=0.5, device="numpy", rng=rng)
    randomize_batch_norms(model, rng).eval()
    x = tensor(rng, (2, 3, 40, 40))
    plan = InferencePlan(model, x.shape)
    # 52 conv + BN pairs, 35 ReLU6, 10 skip connections; 52 convs + pool, flatten, linear remain.
    assert plan.stats["folded_batch_norm"] == 52
    assert plan.stats["fused_activation"] == 35
    assert plan.stats["fused_residual"] == 10
    assert plan.stats["steps"] == 55
    assert relative_error(plan(x).numpy(), eager(model, x)) < 1e-4


def test_vgg_style_network_fuses_conv_relus_and_keeps_the_rest(rng):
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, rng=rng), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1, rng=rng), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(8 * 4 * 4, 16, rng=rng), nn.ReLU(), nn.Dropout(0.5),
        nn.Linear(16, 5, rng=rng)).to("numpy").eval()
    x = tensor(rng, (2, 3, 16, 16))
    plan = InferencePlan(model, x.shape)
    assert plan.stats["fused_activation"] == 2          # the linear's ReLU stays an operator
    names = [s.name for s in plan.program.steps]
    assert names == ["conv2d", "max_pool2d", "conv2d", "max_pool2d", "reshape", "linear",
                     "relu", "linear"]
    assert relative_error(plan(x).numpy(), eager(model, x)) < 1e-5


class TwoReaders(Module):
    """The conv's output feeds the batch norm and the add: nothing may be fused away."""

    def __init__(self, rng):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1, rng=rng)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x):
        y = self.conv(x)
        return ops.relu6(self.bn(y) + y)


def test_a_value_read_twice_is_not_fused_away(rng):
    model = randomize_batch_norms(TwoReaders(rng).to("numpy"), rng).eval()
    x = tensor(rng, (2, 3, 4, 4))
    plan = InferencePlan(model, x.shape)
    assert plan.stats["folded_batch_norm"] == plan.stats["fused_residual"] == 0
    assert relative_error(plan(x).numpy(), eager(model, x)) < 1e-5


class LateOperand(Module):
    """conv(x) + relu(x): the residual comes after the conv; the fused conv moves to the add."""

    def __init__(self, rng):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1, rng=rng)

    def forward(self, x):
        y = self.conv(x)
        return y + ops.relu(x)


def test_residual_computed_after_the_conv_is_fused_correctly(rng):
    model = LateOperand(rng).to("numpy").eval()
    x = tensor(rng, (2, 4, 5, 5))
    plan = InferencePlan(model, x.shape)
    assert plan.stats["fused_residual"] == 1
    assert [s.name for s in plan.program.steps] == ["relu", "conv2d"]
    assert relative_error(plan(x).numpy(), eager(model, x)) < 1e-5


class BroadcastAdd(Module):
    def __init__(self, rng):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1, rng=rng)
        self.shift = nn.Parameter(rng.standard_normal((1, 3, 1, 1)))

    def forward(self, x):
        return self.conv(x) + self.shift


def test_a_broadcasting_add_is_not_a_residual(rng):
    model = BroadcastAdd(rng).to("numpy").eval()
    x = tensor(rng, (2, 3, 4, 4))
    plan = InferencePlan(model, x.shape)
    assert plan.stats["fused_residual"] == 0
    assert relative_error(plan(x).numpy(), eager(model, x)) < 1e-6


def test_weight_only_subexpressions_become_constants(rng):
    """GDN's reparameterised beta and gamma are computed once, at build time."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, rng=rng), nn.GDN(4)).to("numpy").eval()
    x = tensor(rng, (2, 3, 6, 6))
    plan = InferencePlan(model, x.shape)
    assert plan.stats["folded_constants"] > 0
    assert [s.name for s in plan.program.steps] == ["conv2d", "gdn"]
    assert relative_error(plan(x).numpy(), eager(model, x)) < 1e-6


def test_batch_norm_after_a_concat_becomes_one_kernel_with_its_relu(rng):
    class DenseLayer(Module):
        """DenseNet's pre-activation: concat -> batch norm -> relu -> conv."""

        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm2d(6)
            self.conv = nn.Conv2d(6, 3, 3, padding=1, rng=rng)

        def forward(self, x):
            return self.conv(ops.relu(self.bn(ops.concat([x, x * 2], 1))))
    model = randomize_batch_norms(DenseLayer().to("numpy"), rng).eval()
    x = tensor(rng, (2, 3, 5, 7))
    plan = InferencePlan(model, x.shape)
    assert plan.stats["batch_norm_as_affine"] == 1
    assert plan.stats["fused_concatenation"] == 1
    # The concatenation, the batch norm's multiply and add, and the relu: one step, which
    # reads the concatenation's two parts.
    assert [s.fused for s in plan.program.steps if s.name == "fused_elementwise"] == [
        ("concat", "mul", "add", "relu")]
    names = [s.name for s in plan.program.steps]
    assert "batch_norm" not in names and "concat" not in names
    assert relative_error(plan(x).numpy(), eager(model, x)) < 1e-5


def test_a_concatenation_read_elsewhere_too_stays(rng):
    class TwoReaders(Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm2d(6)

        def forward(self, x):
            c = ops.concat([x, x * 2], 1)
            return self.conv(c) + ops.relu(self.bn(c))
    model = TwoReaders()
    model.conv = nn.Conv2d(6, 6, 1, rng=rng)
    model = randomize_batch_norms(model.to("numpy"), rng).eval()
    x = tensor(rng, (2, 3, 5, 7))
    plan = InferencePlan(model, x.shape)
    # The convolution reads the concatenation too: it is made, and read by both.
    assert plan.stats["fused_concatenation"] == 0
    assert "concat" in [s.name for s in plan.program.steps]
    assert relative_error(plan(x).numpy(), eager(model, x)) < 1e-5
