"""Inference plans (gdnflow.inference.plan): the per-shape plan cache and stale-weight
detection on NumPy, gdnflow.compile; on the GPU, plans captured as CUDA graphs against the
unplanned models."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import inference, nn
from gdnflow.inference import InferencePlan, PlanError, StalePlanError
from gdnflow.testing import relative_error
from gdnflow.tensor import weights_changed
from inference_models import (Residual, changed_state, eager, gpu_model, randomize_batch_norms,
                              small_model, tensor)


def test_training_mode_is_refused(rng):
    model = nn.Sequential(nn.Conv2d(2, 2, 1, rng=rng), nn.BatchNorm2d(2)).to("numpy")
    with pytest.raises(PlanError, match="training mode.*model.eval"):
        inference.compile(model, (1, 2, 3, 3))


def test_wrong_input_shape_is_refused(rng):
    model = nn.Sequential(nn.Conv2d(2, 2, 1, rng=rng)).to("numpy").eval()
    plan = InferencePlan(model, (1, 2, 3, 3))
    with pytest.raises(gf.ShapeError, match=r"\(1, 2, 3, 3\): got \(1, 2, 4, 4\)"):
        plan(tensor(rng, (1, 2, 4, 4)))


# ---------------------------------------------------- cache and staleness --
def test_plans_are_cached_per_input_shape(rng):
    model = small_model(rng)
    compiled = inference.compile(model, (2, 3, 5, 5))
    first = compiled.plan((2, 3, 5, 5))
    x = tensor(rng, (2, 3, 5, 5))
    compiled(x)
    assert compiled.plan((2, 3, 5, 5)) is first and compiled.builds == 1
    y = tensor(rng, (1, 3, 8, 8))
    assert relative_error(compiled(y).numpy(), eager(model, y)) < 1e-5
    assert compiled.builds == 2 and set(compiled.plans) == {((2, 3, 5, 5), "fp32"), ((1, 3, 8, 8), "fp32")}
    assert compiled.plan((2, 3, 5, 5)) is first


def test_least_recently_used_plan_is_dropped_beyond_max_plans(rng):
    compiled = inference.compile(small_model(rng), max_plans=2)
    for size in (4, 5, 4, 6):
        compiled(tensor(rng, (1, 3, size, size)))
    assert list(compiled.plans) == [((1, 3, 4, 4), "fp32"), ((1, 3, 6, 6), "fp32")]


def test_eager_calls_run_the_model_until_a_shape_comes_again(rng):
    model = small_model(rng)
    compiled = inference.compile(model, eager_calls=1)
    x, y = tensor(rng, (1, 3, 5, 5)), tensor(rng, (2, 3, 6, 6))
    first = compiled(x)
    assert compiled.builds == 0 and not compiled.plans      # the first call builds nothing
    assert relative_error(first.numpy(), eager(model, x)) < 1e-6
    assert not first.requires_grad                          # run under no_grad
    second = compiled(x).numpy()
    assert compiled.builds == 1 and list(compiled.plans) == [((1, 3, 5, 5), "fp32")]
    assert relative_error(second, eager(model, x)) < 1e-5
    compiled(x)
    compiled(y)                                             # a new shape: eager again
    assert compiled.builds == 1 and len(compiled.plans) == 1
    compiled(y.numpy())                                     # arrays as well as tensors
    assert compiled.builds == 2


def test_eager_calls_take_arrays(rng):
    model = small_model(rng)
    compiled = inference.compile(model, eager_calls=1)
    x = tensor(rng, (1, 3, 5, 5))
    first = compiled(x.numpy())
    assert compiled.builds == 0 and first.device == "numpy"
    assert relative_error(first.numpy(), eager(model, x)) < 1e-6


def test_with_eager_calls_a_shape_whose_plan_was_dropped_stays_eager(rng):
    # Three shapes in rotation over one plan: each built once at most, not on every turn.
    compiled = inference.compile(small_model(rng), eager_calls=1, max_plans=1)
    shapes = [(1, 3, 4, 4), (1, 3, 5, 5), (1, 3, 6, 6)]
    for turn in range(4):
        for shape in shapes:
            compiled(tensor(rng, shape))
        # Turn 0 runs each eagerly; turn 1 builds each, each build dropping the last.
        assert compiled.builds == (0 if turn == 0 else 3)
    assert list(compiled.plans) == [((1, 3, 6, 6), "fp32")]


def test_eager_calls_must_be_a_whole_number(rng):
    for bad in (-1, 1.5, "1", True):
        with pytest.raises(ValueError, match="eager_calls must be a whole number"):
            inference.compile(small_model(rng), eager_calls=bad)


def test_loading_new_weights_rebuilds_the_plan(rng):
    model = small_model(rng)
    compiled = inference.compile(model, (2, 3, 5, 5))
    x = tensor(rng, (2, 3, 5, 5))
    before = compiled(x).numpy()
    model.load_state_dict(changed_state(model, rng))
    after = compiled(x).numpy()
    assert compiled.rebuilds == 1 and compiled.builds == 2
    assert relative_error(after, eager(model, x)) < 1e-5
    assert relative_error(after, before) > 1e-2


def test_a_stale_plan_refuses_to_run(rng):
    model = small_model(rng)
    plan = InferencePlan(model, (1, 3, 4, 4))
    x = tensor(rng, (1, 3, 4, 4))
    plan(x)
    model.load_state_dict(changed_state(model, rng))
    assert plan.stale
    with pytest.raises(StalePlanError, match="weights changed"):
        plan(x)


def test_on_stale_error_refuses_instead_of_rebuilding(rng):
    model = small_model(rng)
    compiled = inference.compile(model, (1, 3, 4, 4), on_stale="error")
    x = tensor(rng, (1, 3, 4, 4))
    compiled(x)
    weights_changed()
    with pytest.raises(StalePlanError, match="on_stale='error'"):
        compiled(x)
    compiled.invalidate()
    compiled(x)             # after an explicit invalidate() it builds again


def test_optimizer_step_train_mode_and_moves_make_plans_stale(rng):
    from gdnflow.optim import SGD
    model = small_model(rng)
    compiled = inference.compile(model)
    x = tensor(rng, (1, 3, 4, 4))
    compiled(x)
    model.train()
    with pytest.raises(PlanError, match="training mode"):
        compiled(x)         # stale, and a rebuild needs eval mode
    y = model(tensor(rng, (4, 3, 4, 4)))        # a training forward: running statistics move
    opt = SGD(model.parameters(), lr=0.5)
    y.sum().backward()
    opt.step()
    model.eval()
    assert relative_error(compiled(x).numpy(), eager(model, x)) < 1e-5
    assert compiled.rebuilds == 1
    plan = compiled.plan(x.shape)
    model.to("numpy")       # already there: nothing replaced, the plan stays current
    assert not plan.stale
    opt.step()
    assert plan.stale


def test_loading_a_checkpoint_in_place_makes_plans_stale(rng, tmp_path):
    pytest.importorskip("h5py")
    from gdnflow.io import load_checkpoint, save_checkpoint
    model = small_model(rng)
    other = small_model(rng)
    save_checkpoint(tmp_path / "other.h5", other)
    compiled = inference.compile(model, (1, 3, 4, 4))
    x = tensor(rng, (1, 3, 4, 4))
    compiled(x)
    load_checkpoint(tmp_path / "other.h5", model)   # same Parameter objects, new arrays
    assert relative_error(compiled(x).numpy(), eager(other, x)) < 1e-5
    assert compiled.rebuilds == 1


def test_gdnflow_compile_is_the_entry_point(rng):
    model = small_model(rng)
    x = tensor(rng, (1, 3, 4, 4))
    compiled = gf.compile(model, x.shape)
    assert isinstance(compiled, inference.CompiledModel) and compiled.plans
    assert relative_error(compiled(x).numpy(), eager(model, x)) < 1e-5


# --------------------------------------------------------------------- GPU --
@pytest.mark.gpu
@pytest.mark.parametrize("name,batch", [("mobilenet_v2", 1), ("mobilenet_v2", 4), ("vgg16", 1)])
def test_plan_equals_the_unplanned_model_on_the_gpu(name, batch, rng):
    model = gpu_model(name, rng)
    compiled = inference.compile(model, (batch, 3, 224, 224))
    plan = compiled.plan((batch, 3, 224, 224))
    assert plan.graph is not None
    assert plan.stats["arena_bytes"] < plan.stats["allocated_bytes"]   # buffers were shared
    for _ in range(2):          # fresh inputs, each against the eager model
        x = tensor(rng, (batch, 3, 224, 224), "cuda")
        assert relative_error(compiled(x).numpy(), eager(model, x)) <= 1e-4


@pytest.mark.gpu
def test_replaying_twice_gives_identical_results_and_follows_the_input(rng):
    model = gpu_model("mobilenet_v2", rng)
    plan = InferencePlan(model, (2, 3, 96, 96))
    x1, x2 = tensor(rng, (2, 3, 96, 96), "cuda"), tensor(rng, (2, 3, 96, 96), "cuda")
    first = plan(x1).numpy()
    np.testing.assert_array_equal(plan(x1).numpy(), first)
    y = plan(x2)
    second = y.numpy()
    assert relative_error(second, eager(model, x2)) <= 1e-4
    plan(x1.numpy())                        # host input: copied to the static buffer too
    np.testing.assert_array_equal(y.numpy(), first)     # the returned tensor was overwritten
    np.testing.assert_array_equal(plan.replay().numpy(), first)    # input still holds x1


@pytest.mark.gpu
def test_graph_reads_the_filter_transforms_made_at_build(rng):
    # Winograd's U of each layer is made once, by the warm-up run, and kept by
    # the plan: zeroing the kept transforms changes what the next replay gives
    # (a graph that transformed the filters itself would not notice).
    import pycuda.driver as drv
    model = nn.Sequential(nn.Conv2d(64, 128, 3, padding=1, rng=rng),
                          nn.Conv2d(128, 64, 3, padding=1, rng=rng)).to("cuda").eval()
    x = tensor(rng, (4, 64, 28, 28), "cuda")
    plan = InferencePlan(model, x.shape)
    # F(4x4, 3x3): 36 floats per channel pair, two layers of 64 x 128.
    assert plan.stats["derived_weight_bytes"] == 2 * 36 * 64 * 128 * 4
    assert relative_error(plan(x).numpy(), eager(model, x)) <= 1e-4
    for _, derived in plan._derived_weights.values():
        drv.memset_d32(derived.ptr, 0, derived.size)
    assert relative_error(plan(x).numpy(), eager(model, x)) > 0.5
    plan.close()
    assert plan._derived_weights is None


@pytest.mark.gpu
def test_a_new_input_shape_builds_a_new_graph_plan(rng):
    model = gpu_model("mobilenet_v2", rng)
    compiled = inference.compile(model)
    for shape in [(1, 3, 64, 64), (3, 3, 96, 96), (1, 3, 64, 64)]:
        x = tensor(rng, shape, "cuda")
        assert relative_error(compiled(x).numpy(), eager(model, x)) <= 1e-4
    assert compiled.builds == 2 and all(p.graph is not None for p in compiled.plans.values())


@pytest.mark.gpu
def test_changed_weights_rebuild_or_refuse_on_the_gpu(rng):
    from gdnflow.optim import SGD
    model = nn.Sequential(Residual(8, rng), nn.Conv2d(8, 8, 1, activation="relu6", rng=rng))
    model = randomize_batch_norms(model.to("cuda"), rng).eval()
    x = tensor(rng, (2, 8, 12, 12), "cuda")
    compiled = inference.compile(model, x.shape)
    strict = inference.compile(model, x.shape, on_stale="error")
    plan = compiled.plan(x.shape)
    assert plan.program.steps[0].fused == ("batch_norm", "residual", "relu")
    before = compiled(x).numpy()
    model.load_state_dict(changed_state(model, rng))
    after = compiled(x).numpy()
    assert relative_error(after, eager(model, x)) <= 1e-4 and compiled.rebuilds == 1
    assert relative_error(after, before) > 1e-2
    with pytest.raises(StalePlanError):
        plan(x)
    with pytest.raises(StalePlanError):
        strict(x)
    # An optimiser step updates the weights in place: same arrays, new values.
    model.train()
    loss = model(tensor(rng, (2, 8, 12, 12), "cuda")).sum()
    loss.backward()
    SGD(model.parameters(), lr=0.1).step()
    model.eval()
    assert relative_error(compiled(x).numpy(), eager(model, x)) <= 1e-4
    assert compiled.rebuilds == 2


@pytest.mark.gpu
def test_gdn_autoencoder_transforms_run_as_graph_plans(rng):
    # 5x5 / 2 convolutions and transposed convolutions through the sub-pixel
    # rewrite (Winograd with phase views, bias fused) and GDN layers, each
    # transform captured in one CUDA graph, against the eager modules.
    from gdnflow.models.factorized_prior import FactorizedPrior
    from gdnflow.ops import conv as conv_module
    from gdnflow.ops.conv.algorithms.subpixel import Subpixel
    model = FactorizedPrior(64, 96, seed=0, device="cuda").eval()
    inputs = {"g_a": tensor(rng, (2, 3, 128, 128), "cuda"),
              "g_s": tensor(rng, (2, 96, 8, 8), "cuda")}
    for name, x in inputs.items():
        transform = getattr(model, name)
        compiled = inference.compile(transform, x.shape)
        assert compiled.plan(x.shape).graph is not None
        for _ in range(2):
            assert relative_error(compiled(x).numpy(), eager(transform, x)) <= 1e-4
            x = tensor(rng, x.shape, "cuda")
    assert Subpixel in conv_module.planner.cache.values()
