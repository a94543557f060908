"""Inference plans (gdnflow.inference): batch-norm folding, activation and residual
fusion, the traced program, the buffer-lifetime allocator, the per-shape plan
cache and stale-weight detection on NumPy; on the GPU, CUDA graph capture
(gdnflow.backends.cuda.graphs) and plans against the unplanned models."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import inference, models, nn, ops
from gdnflow.inference import (InferencePlan, PlanError, StalePlanError, plan_memory,
                               _ArenaPool, _RecordingPool)
from gdnflow.nn.module import Module, weights_changed
from gdnflow.testing import relative_error


def randomize_batch_norms(model, rng):
    """Batch-norm statistics and affine parameters away from 0 and 1, via load_state_dict."""
    state = model.state_dict()
    for key, value in state.items():
        if key.endswith("running_mean"):
            state[key] = rng.uniform(-0.2, 0.2, value.shape)
        elif key.endswith("running_var"):
            state[key] = rng.uniform(0.5, 1.5, value.shape)
    for name, module in model.named_modules():
        if isinstance(module, nn.BatchNorm2d):
            state[name + "weight"] = rng.uniform(0.5, 1.5, module.num_features)
            state[name + "bias"] = rng.uniform(-0.2, 0.2, module.num_features)
    model.load_state_dict(state)
    return model


def eager(model, x):
    with gf.no_grad():
        return model(x).numpy()


def tensor(rng, shape, device="numpy"):
    return gf.tensor(rng.standard_normal(shape), device=device)


class Residual(Module):
    """relu(x + bn(conv(x))): folds, fuses the residual, then the activation, into one conv."""

    def __init__(self, channels, rng):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False, rng=rng)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return ops.relu(x + self.bn(self.conv(x)))


# ---------------------------------------------------------------- folding --
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


def test_training_mode_is_refused(rng):
    model = nn.Sequential(nn.Conv2d(2, 2, 1, rng=rng), nn.BatchNorm2d(2)).to("numpy")
    with pytest.raises(PlanError, match="training mode.*model.eval"):
        inference.compile(model, (1, 2, 3, 3))


def test_wrong_input_shape_is_refused(rng):
    model = nn.Sequential(nn.Conv2d(2, 2, 1, rng=rng)).to("numpy").eval()
    plan = InferencePlan(model, (1, 2, 3, 3))
    with pytest.raises(gf.ShapeError, match=r"\(1, 2, 3, 3\): got \(1, 2, 4, 4\)"):
        plan(tensor(rng, (1, 2, 4, 4)))


# ------------------------------------------------------------------ memory --
def check_no_live_overlap(sizes, freed_at, offsets, total):
    n = len(sizes)
    ends = [n if f is None else f for f in freed_at]
    for i in range(n):
        assert offsets[i] % 256 == 0 and offsets[i] + sizes[i] <= total
        for j in range(i + 1, n):
            if j < ends[i]:         # both live when j is allocated
                assert (offsets[i] + sizes[i] <= offsets[j]
                        or offsets[j] + sizes[j] <= offsets[i]), (i, j)


def peak_live_bytes(sizes, freed_at):
    n = len(sizes)
    ends = [n if f is None else f for f in freed_at]
    return max(sum(-(-sizes[i] // 256) * 256 for i in range(t + 1) if ends[i] > t)
               for t in range(n))


@pytest.mark.parametrize("trial", range(20))
def test_allocator_never_gives_overlapping_live_buffers_the_same_bytes(trial, rng):
    n = int(rng.integers(1, 60))
    sizes = [int(s) for s in rng.integers(1, 1 << 20, n)]
    freed_at = [None if rng.random() < 0.1 else int(rng.integers(i + 1, n + 1)) for i in range(n)]
    offsets, total = plan_memory(sizes, freed_at)
    check_no_live_overlap(sizes, freed_at, offsets, total)
    assert peak_live_bytes(sizes, freed_at) <= total <= sum(-(-s // 256) * 256 for s in sizes)


def test_allocator_reuses_buffers_of_a_chain():
    """Layer after layer, each output freed once the next is made: two buffers' worth suffice."""
    sizes = [1000, 4096, 1000, 4096, 1000]
    offsets, total = plan_memory(sizes, [2, 3, 4, 5, None])
    assert total == 4096 + 1024
    check_no_live_overlap(sizes, [2, 3, 4, 5, None], offsets, total)


def test_allocator_rejects_impossible_lifetimes():
    with pytest.raises(ValueError, match="freed at 0"):
        plan_memory([16, 16], [0, None])


class FakePool:
    def __init__(self):
        self.next = 1 << 20

    def allocate(self, nbytes):
        self.next += nbytes
        return self.next


def test_recording_pool_notes_when_python_frees_each_block():
    recorder = _RecordingPool(FakePool())
    a = recorder.allocate(100)
    b = recorder.allocate(200)
    del a
    c = recorder.allocate(300)
    del b, c
    assert recorder.sizes == [100, 200, 300]
    assert recorder.freed_at == [2, 3, 3]


def test_arena_pool_hands_out_the_plan_and_refuses_another_sequence():
    pool = _ArenaPool(4096, [0, 512], [100, 200])
    assert int(pool.allocate(100)) == 4096 and int(pool.allocate(200)) == 4608
    with pytest.raises(PlanError, match="allocation #2 asks for 8 bytes"):
        pool.allocate(8)
    with pytest.raises(PlanError, match="allocation #0 asks for 99 bytes but the recording "
                                        "run made 100"):
        _ArenaPool(0, [0], [100]).allocate(99)


# ---------------------------------------------------- cache and staleness --
def small_model(rng, device="numpy"):
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False, rng=rng), nn.BatchNorm2d(4),
                          nn.ReLU6()).to(device)
    return randomize_batch_norms(model, rng).eval()


def test_plans_are_cached_per_input_shape(rng):
    model = small_model(rng)
    compiled = inference.compile(model, (2, 3, 5, 5))
    first = compiled.plan((2, 3, 5, 5))
    x = tensor(rng, (2, 3, 5, 5))
    compiled(x)
    assert compiled.plan((2, 3, 5, 5)) is first and compiled.builds == 1
    y = tensor(rng, (1, 3, 8, 8))
    assert relative_error(compiled(y).numpy(), eager(model, y)) < 1e-5
    assert compiled.builds == 2 and set(compiled.plans) == {(2, 3, 5, 5), (1, 3, 8, 8)}
    assert compiled.plan((2, 3, 5, 5)) is first


def test_least_recently_used_plan_is_dropped_beyond_max_plans(rng):
    compiled = inference.compile(small_model(rng), max_plans=2)
    for size in (4, 5, 4, 6):
        compiled(tensor(rng, (1, 3, size, size)))
    assert list(compiled.plans) == [(1, 3, 4, 4), (1, 3, 6, 6)]


def changed_state(model, rng):
    state = model.state_dict()
    state = {k: v + rng.uniform(0.1, 0.2, v.shape).astype(v.dtype) for k, v in state.items()}
    return state


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


def test_module_compile_inference_method(rng):
    model = small_model(rng)
    x = tensor(rng, (1, 3, 4, 4))
    compiled = model.compile_inference(x.shape)
    assert isinstance(compiled, inference.CompiledModel) and compiled.plans
    assert relative_error(compiled(x).numpy(), eager(model, x)) < 1e-5


def test_bench_code_runs_on_numpy_with_stand_in_timers():
    from gdnflow import inference_bench
    calls = []

    def timer(fn, warmup, repeats):
        fn()
        calls.append(fn)
        return 1.0
    rows, notes = inference_bench.run(["mobilenet_v2"], [2], 0, 1, torch=None,
                                      timers=(timer, timer), log=lambda line: None,
                                      device="numpy", image_size=32)
    assert len(calls) == 3 and len(rows) == 1 and len(rows[0]) == len(inference_bench.HEADERS)
    assert rows[0][:2] == ["mobilenet_v2", 2] and rows[0][6] == "1.000"
    assert "52 batch norms folded" in notes[0]


def test_bench_command_parses_its_options():
    import argparse
    from gdnflow import inference_bench
    parser = argparse.ArgumentParser()
    inference_bench.add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--models", "vgg16", "--batches", "1", "--no-torch"])
    assert args.models == "vgg16" and args.batches == "1" and args.no_torch
    assert args.run is inference_bench.cmd_bench


# --------------------------------------------------------------------- GPU --
@pytest.mark.gpu
def test_cuda_graph_replays_captured_kernels_on_new_data(rng):
    import pycuda.driver as drv
    from gdnflow.backends import cuda
    from gdnflow.backends.cuda.graphs import CudaGraph
    from gdnflow.backends.cuda.runtime import get_runtime
    runtime = get_runtime()
    host = rng.standard_normal(1000).astype(np.float32)
    x = runtime.from_numpy(host)
    y = runtime.full((1000,), np.nan)
    relu = cuda.kernel("elementwise.cu", "relu_forward", "PPiff")
    relu.launch(1000, x.ptr, y.ptr, 1000, 0.0, 0.0)     # compile and load before capture
    graph = CudaGraph()
    assert graph.capture(lambda: relu.launch(1000, x.ptr, y.ptr, 1000, 0.0, 0.0)) is None
    for _ in range(2):
        host = rng.standard_normal(1000).astype(np.float32)
        x2 = runtime.from_numpy(host)
        drv.memcpy_dtod_async(x.ptr, x2.ptr, x.nbytes, runtime.stream)
        graph.replay()
        np.testing.assert_array_equal(y.get(), np.maximum(host, 0))
    graph.close()
    graph.close()           # idempotent


@pytest.mark.gpu
def test_cublas_gemm_is_captured_without_allocating(rng):
    from gdnflow.backends.cuda import blas
    from gdnflow.backends.cuda.graphs import CudaGraph
    from gdnflow.backends.cuda.runtime import get_runtime
    runtime = get_runtime()
    a, b = (rng.standard_normal((64, 96)).astype(np.float32),
            rng.standard_normal((96, 80)).astype(np.float32))
    da, db, dc = runtime.from_numpy(a), runtime.from_numpy(b), runtime.full((64, 80), np.nan)
    blas.matmul(da.ptr, db.ptr, dc.ptr, 64, 80, 96)             # handle and kernels first
    runtime.stream.synchronize()
    graph = CudaGraph()
    graph.capture(lambda: blas.matmul(da.ptr, db.ptr, dc.ptr, 64, 80, 96), mode="global")
    graph.replay()
    np.testing.assert_allclose(dc.get(), a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_capture_refuses_an_allocation_and_leaves_the_stream_usable():
    import pycuda.driver as drv
    from gdnflow.backends.cuda.graphs import CAPTURE_STATUS_NONE, CudaGraph, capture_status
    from gdnflow.backends.cuda.runtime import get_runtime
    graph = CudaGraph()
    with pytest.raises(Exception) as info:
        graph.capture(lambda: drv.mem_alloc(1 << 20))
    assert any("capturing a CUDA graph" in note for note in getattr(info.value, "__notes__", []))
    assert capture_status(get_runtime().stream) == CAPTURE_STATUS_NONE and not graph.captured
    x = gf.tensor([-1.0, 2.0], device="cuda")
    np.testing.assert_array_equal(ops.relu(x).numpy(), [0.0, 2.0])


def gpu_model(name, rng):
    model = models.get(name)(device="cuda", rng=rng)
    return randomize_batch_norms(model, rng).eval()


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
