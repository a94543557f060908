"""conv2d on 16-bit tensors: the NumPy emulation (float32 inside, one rounding) and the GPU's
16-bit GEMM algorithms against it. GPU tolerance: products', 2 eps of the dtype relative
to the largest reference magnitude (the GPU rounds the GEMM's result, then the epilogue's)."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import ops, precision
from gdnflow.testing import assert_half_backends_match, round_to_bfloat16

EPS = {"bf16": 2.0 ** -7, "fp16": 2.0 ** -10}
#: (x shape, w shape, conv2d keyword arguments): the 16-bit GEMM algorithms (1x1, im2col
#: at several kernel sizes, strides, dilations and groups), the grouped direct kernel's
#: forward (layers on RGB, groups of few channels; their gradients take im2col, or
#: float32 past 4 groups) and depthwise layers (the 16-bit depthwise forward; their
#: backward computes in float32). "4 groups" is a depthwise layer too (groups == channels).
LAYERS = {
    "1x1": ((2, 24, 7, 9), (40, 24, 1, 1), {}),
    "3x3 pad 1 + bias + relu": ((3, 8, 11, 13), (16, 8, 3, 3), {"padding": 1, "activation": "relu"}),
    "5x5 stride 2": ((2, 3, 17, 15), (12, 3, 5, 5), {"stride": 2, "padding": 2}),
    "3x3 dilation 2, 2 groups": ((2, 8, 12, 10), (6, 4, 3, 3), {"dilation": 2, "groups": 2}),
    "3x3 / 2 on RGB, 40 out + relu6": ((3, 3, 29, 31), (40, 3, 3, 3),
                                       {"stride": 2, "padding": 1, "activation": "relu6"}),
    "3x3, 6 groups of 4 + relu": ((2, 24, 9, 11), (12, 4, 3, 3), {"groups": 6, "padding": 1,
                                                                   "activation": "relu"}),
    "depthwise 3x3 + relu6": ((2, 16, 9, 9), (16, 1, 3, 3), {"groups": 16, "padding": 1,
                                                             "activation": "relu6"}),
    "depthwise 5x5 stride 2": ((3, 12, 17, 19), (12, 1, 5, 5), {"groups": 12, "stride": 2,
                                                                "padding": 2}),
    "depthwise 3x3, rows of 1031": ((1, 8, 5, 1031), (8, 1, 3, 3), {"groups": 8, "padding": 1}),
    "depthwise 3x3, 112x112 in strips": ((1, 4, 112, 112), (4, 1, 3, 3), {"groups": 4,
                                                                          "padding": 1}),
}


#: Layers the tensor-core implicit GEMM takes (stride 1, one group, >= 16 channels in;
#: wider than 1x1 with at least 330 blocks: two per SM up to 165 SMs, or 1x1 on an odd
#: plane of at least 4 column tiles; the planner is
#: checked to pick it for each, on a simulated H200 and on the GPU the tests run on):
#: both row tiles (64 and 128 channels), several K steps, channels that do not fill a
#: step, columns that cross images, odd planes, dilation and uneven padding.
IMPLICIT_GEMM_LAYERS = {
    "3x3 pad 1, 19 -> 70 + relu": ((5, 19, 89, 97), (70, 19, 3, 3), {"padding": 1,
                                                                     "activation": "relu"}),
    "3x1 pad (1, 1, 0, 0), 130 -> 200": ((4, 130, 75, 77), (200, 130, 3, 1),
                                         {"padding": (1, 1, 0, 0)}),
    "3x3 dilation 2, uneven padding, 33 -> 40": ((5, 33, 90, 96), (40, 33, 3, 3),
                                                 {"padding": (2, 1, 0, 3), "dilation": 2}),
    "5x5 pad 2, 16 -> 130 + relu6": ((3, 16, 77, 75), (130, 16, 5, 5), {"padding": 2,
                                                                       "activation": "relu6"}),
    "3x3 pad 1, 64 -> 64": ((48, 64, 30, 30), (64, 64, 3, 3), {"padding": 1}),
    "3x3 pad 1, 96 -> 256, odd plane": ((10, 96, 45, 47), (256, 96, 3, 3), {"padding": 1}),
    # 1x1 on odd planes of at least 4 column tiles, whatever the block count (here 3 x 4).
    "1x1 on 7x7, 160 -> 150 + relu6": ((9, 160, 7, 7), (150, 160, 1, 1), {"activation": "relu6"}),
}


def conv_fn(w_shape, options):
    def fn(x, w, b):
        return ops.conv2d(x, w, b, **options)
    return fn


def inputs(x_shape, w_shape, rng):
    fan_in = np.prod(w_shape[1:])
    return [rng.standard_normal(x_shape), rng.standard_normal(w_shape) / np.sqrt(fan_in),
            rng.standard_normal(w_shape[0]) * 0.1]


def test_a_16_bit_conv_on_numpy_is_the_float32_conv_rounded_once(rng):
    x = rng.standard_normal((2, 5, 9, 8)).astype(precision.BFLOAT16)
    w = (rng.standard_normal((7, 5, 3, 3)) / 6).astype(precision.BFLOAT16)
    y = ops.conv2d(gf.tensor(x, device="numpy", dtype="bf16"),
                   gf.tensor(w, device="numpy", dtype="bf16"), padding=1)
    wide = ops.conv2d(gf.tensor(x.astype(np.float32), device="numpy"),
                      gf.tensor(w.astype(np.float32), device="numpy"), padding=1)
    assert y.dtype == precision.BFLOAT16
    np.testing.assert_array_equal(y.numpy().astype(np.float32), round_to_bfloat16(wide.numpy()))


def test_autocast_runs_conv2d_in_16_bits_with_float32_weight_gradients(rng):
    x = gf.tensor(rng.standard_normal((2, 3, 8, 8)), device="numpy")
    w = gf.tensor(rng.standard_normal((4, 3, 3, 3)) / 5, device="numpy", requires_grad=True)
    with gf.autocast("fp16"):
        y = ops.conv2d(x, w, padding=1, activation="relu")
        loss = y.mean()
    assert y.dtype == precision.FLOAT16 and loss.dtype == np.float32
    loss.backward()
    assert w.grad.dtype == np.float32 and np.abs(w.grad.numpy()).max() > 0


def test_16_bit_strided_data_gradients_take_the_sub_pixel_rewrite():
    # A codec's 5x5 / 2 layer: its data gradient (and so conv_transpose2d's forward)
    # as a stride-1 3x3 im2col + GEMM on the phases, not im2col + GEMM + col2im.
    from gdnflow.ops.conv.algorithms.subpixel import subpixel_plan
    from gdnflow.ops.conv.geometry import ConvGeometry
    from gdnflow.ops.conv.planning import half_conv_algorithm
    g = ConvGeometry(16, 128, 128, 128, 128, 5, 5, (2, 2), (2, 2, 2, 2), (1, 1), 1)
    chosen = {stage: half_conv_algorithm(g, stage).name
              for stage in ("forward", "backward_data", "backward_weight")}
    assert chosen == {"forward": "im2col_gemm", "backward_data": "subpixel",
                      "backward_weight": "im2col_gemm"}
    inner = subpixel_plan(g).inner
    assert (inner.kh, inner.kw, inner.stride) == (3, 3, (1, 1))
    assert half_conv_algorithm(g, "backward_data").planner.choose(inner, "forward").name == \
        "im2col_gemm"
    # A 1x1 / 2 shortcut's taps do not overlap: its col2im is a scatter, the rewrite
    # would only multiply the product's work.
    shortcut = ConvGeometry(16, 256, 56, 56, 512, 1, 1, (2, 2), (0, 0, 0, 0), (1, 1), 1)
    assert half_conv_algorithm(shortcut, "backward_data").name == "im2col_gemm"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("name", LAYERS)
def test_16_bit_conv2d_matches_the_emulation(name, dtype, rng):
    x_shape, w_shape, options = LAYERS[name]
    assert_half_backends_match(conv_fn(w_shape, options), inputs(x_shape, w_shape, rng), dtype,
                               rtol=2 * EPS[dtype], names=["x", "w", "b"])


TRANSPOSED = {
    "5x5 stride 2 (a codec's synthesis)": ((2, 12, 9, 11), (12, 8, 5, 5),
                                            {"stride": 2, "padding": 2, "output_padding": 1}),
    "1x1": ((2, 16, 7, 5), (16, 24, 1, 1), {}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("name", TRANSPOSED)
def test_16_bit_conv_transpose2d_matches_the_emulation(name, dtype, rng):
    x_shape, w_shape, options = TRANSPOSED[name]
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape) / np.sqrt(w_shape[0] * 4)
    b = rng.standard_normal(w_shape[1]) * 0.1
    assert_half_backends_match(lambda x, w, b: ops.conv_transpose2d(x, w, b, **options),
                               [x, w, b], dtype, rtol=2 * EPS[dtype], names=["x", "w", "b"])


class GpuFacts:
    """What the planner asks of a GPU, for cuda.simulated: an H200 by default."""

    def __init__(self, compute_capability=(9, 0), max_shared_bytes=232448, sm_count=132):
        self.compute_capability, self.max_shared_bytes = compute_capability, max_shared_bytes
        self.sm_count = sm_count

    def get_runtime(self):
        return self


def implicit_gemm_geometry(x_shape, w_shape, options):
    from gdnflow.ops.conv.geometry import conv_geometry, conv_parameters
    parameters = conv_parameters("conv2d", 1, options.get("padding", 0),
                                 options.get("dilation", 1), 1)
    return conv_geometry("conv2d", x_shape, w_shape, *parameters)


def chosen(g, stage="forward"):
    from gdnflow.ops.conv.planning import half_conv_algorithm
    return half_conv_algorithm(g, stage).name


def test_16_bit_stride_1_forwards_take_the_tensor_core_implicit_gemm():
    from gdnflow.backends import cuda
    from gdnflow.ops.conv.algorithms.implicit_gemm import channel_steps, row_tile
    from gdnflow.ops.conv.geometry import ConvGeometry

    vgg = ConvGeometry(64, 64, 224, 224, 64, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    pointwise = ConvGeometry(64, 24, 56, 56, 144, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    pointwise_odd = ConvGeometry(64, 160, 7, 7, 960, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    # 8 images of 49 pixels are 4 column tiles of 128; 7 are 3.
    pointwise_odd_8, pointwise_odd_7 = (
        ConvGeometry(n, 960, 7, 7, 160, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1) for n in (8, 7))
    rgb = ConvGeometry(64, 3, 224, 224, 64, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    rgb_batch_1 = ConvGeometry(1, 3, 224, 224, 64, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    strided = ConvGeometry(8, 64, 56, 56, 128, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1)
    grouped = ConvGeometry(8, 64, 56, 56, 64, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 2)
    # Batch 1 on a 14x14 plane: 2 blocks of 128 columns x 4 of 128 rows, too few.
    small = ConvGeometry(1, 512, 14, 14, 512, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    with cuda.simulated(GpuFacts()):
        for layer in IMPLICIT_GEMM_LAYERS.values():
            assert chosen(implicit_gemm_geometry(*layer)) == "implicit_gemm"
        assert chosen(vgg) == "implicit_gemm"
        # Gradients keep the GEMMs; so do 1x1 layers (no im2col to save), strided layers,
        # groups of many channels and RGB first layers (3 of a step's 64 channels); small
        # ones of those take the grouped direct kernel.
        assert chosen(vgg, "backward_data") == chosen(vgg, "backward_weight") == "im2col_gemm"
        assert chosen(pointwise) == chosen(pointwise, "backward_data") == "pointwise"
        assert chosen(pointwise_odd) == "implicit_gemm"
        assert chosen(pointwise_odd, "backward_data") == "pointwise"
        assert chosen(pointwise_odd_8) == "implicit_gemm"
        assert chosen(pointwise_odd_7) == "pointwise"
        assert chosen(rgb) == chosen(strided) == chosen(grouped) == chosen(small) == \
            "im2col_gemm"
        assert chosen(rgb_batch_1) == "grouped_direct"
        assert chosen(rgb_batch_1, "backward_data") == "im2col_gemm"
        with gf.config.override(half_conv_tensor_cores=False):
            assert chosen(vgg) == "im2col_gemm"
    # No cp.async before compute capability 8.0; twice the SMs want twice the blocks.
    one_layer = implicit_gemm_geometry(*IMPLICIT_GEMM_LAYERS["3x3 pad 1, 64 -> 64"])
    with cuda.simulated(GpuFacts(compute_capability=(7, 5))):
        assert chosen(vgg) == "im2col_gemm"
    with cuda.simulated(GpuFacts(sm_count=264)):
        assert chosen(one_layer) == "im2col_gemm" and chosen(vgg) == "implicit_gemm"
    # Row tiles pad C_out the least, within the shared memory a block may have (sm_86/89:
    # 99 KB, less than the 128-row tile's 110.6 KB); channels pad to K steps of 64.
    assert [row_tile(c) for c in (16, 64, 96, 128, 160, 320, 512)] == [64, 64, 128, 128, 64,
                                                                        64, 128]
    assert row_tile(512, 101376) == 64 and row_tile(512, 80000) is None
    with cuda.simulated(GpuFacts(compute_capability=(8, 6), max_shared_bytes=101376)):
        assert chosen(vgg) == "implicit_gemm"
    with cuda.simulated(GpuFacts(max_shared_bytes=80000)):
        assert chosen(vgg) == "im2col_gemm"
    assert [channel_steps(c) for c in (16, 64, 65, 144)] == [1, 1, 2, 3]


@pytest.mark.gpu
@pytest.mark.parametrize("wgmma", [True, False], ids=["wgmma on", "wgmma off"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("name", IMPLICIT_GEMM_LAYERS)
def test_16_bit_implicit_gemm_matches_the_emulation(name, dtype, wgmma, rng):
    # On compute capability 9.0 both row tiles multiply by wgmma unless it is off.
    # Gradients (the GEMM paths') only without an activation: the kernel's sums run in
    # another order than the emulation's, so an output within rounding of 0 (or 6) may
    # fall on the other side of it and flip the activation's gradient mask.
    from gdnflow.backends import cuda
    from gdnflow.ops.conv.algorithms.implicit_gemm import uses_wgmma
    x_shape, w_shape, options = IMPLICIT_GEMM_LAYERS[name]
    g = implicit_gemm_geometry(x_shape, w_shape, options)
    with gf.config.override(half_conv_wgmma=wgmma):
        assert chosen(g) == "implicit_gemm"
        assert uses_wgmma() == (wgmma and cuda.compute_capability() == (9, 0))
        assert_half_backends_match(conv_fn(w_shape, options), inputs(x_shape, w_shape, rng),
                                   dtype, rtol=2 * EPS[dtype], names=["x", "w", "b"],
                                   grad="activation" not in options)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("activation", [None, "relu6"])
@pytest.mark.parametrize("c_out", [40, 200], ids=["64-row tile", "128-row tile"])
def test_16_bit_implicit_gemm_fuses_a_residual(activation, dtype, c_out, rng):
    # conv + bias + residual (+ relu6: a MobileNetV2 block's end) in one kernel, against
    # the emulation. Gradients without the activation only: the kernel rounds the sum
    # once where the emulation rounds the convolution first, so an output can land on
    # the other side of 6 (bf16's spacing there is 1/32) and relu6's gradient mask with it.
    x, w, b = inputs((10, 48, 65, 67), (c_out, 48, 3, 3), rng)
    r = rng.standard_normal((10, c_out, 65, 67))
    assert_half_backends_match(
        lambda x, w, b, r: ops.conv2d(x, w, b, padding=1, activation=activation, residual=r),
        [x, w, b, r], dtype, rtol=2 * EPS[dtype], grad=activation is None,
        names=["x", "w", "b", "residual"])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_16_bit_implicit_gemm_without_bias(dtype, rng):
    x, w, _ = inputs((48, 64, 30, 30), (64, 64, 3, 3), rng)
    assert_half_backends_match(lambda x, w: ops.conv2d(x, w, padding=1), [x, w], dtype,
                               rtol=2 * EPS[dtype], names=["x", "w"])
