"""Fused elementwise programs (gdnflow.ops.fused_elementwise) and the plan pass that makes
them (gdnflow.inference.passes.fuse_elementwise): what fuses, what must not, each plan
checked against the eager model; the CUDA interpreter against the NumPy operators."""
import math
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

import gdnflow as gf
from gdnflow import nn, ops, registry
from gdnflow.backends.cuda.kernel_cache import expand_source, nvcc_options
from gdnflow.inference import InferencePlan
from gdnflow.nn.module import Module, Parameter
from gdnflow.backends.cuda.limits import division_constants
from gdnflow.ops.fused_elementwise import (_CONCAT_ARGUMENTS, CONCAT_LAYOUT, MAX_CONCAT_PARTS,
                                           MAX_INPUTS, OPCODES, ConcatInput, FusedElementwise,
                                           Instruction, axis_strides, staged_inputs,
                                           vector_problem)
from gdnflow.ops.broadcast import merged_layout
from gdnflow.ops.shape import ConcatOp, contiguous_strides
from gdnflow.ops.arithmetic import AddOp, MulOp
from gdnflow.ops.elementwise import AffineOp
from gdnflow.ops.special import ErfOp
from gdnflow.tensor import Tensor
from gdnflow.testing import relative_error
from inference_models import randomize_batch_norms

SOURCE = os.path.join(os.path.dirname(__file__), "..", "..", "cuda_src", "elementwise.cu")


def test_opcodes_follow_the_kernel_lists():
    text = open(SOURCE).read()

    def names(macro):
        body = text[text.index(f"#define {macro}(X)"):]
        body = body[:body.index("\n\n")]
        return re.findall(r"X\((\w+),", body)
    assert OPCODES == tuple(names("UNARY_OPERATORS") + names("BINARY_OPERATORS"))


class ConvNeXtBlock(Module):
    """ConvNeXt's block as the ONNX exporter writes it: NHWC in the middle (a layer norm
    after the transpose), GELU as erf, a per-channel layer scale after the transpose
    back, a residual add."""

    def __init__(self, channels, rng):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, groups=channels, rng=rng)
        self.w1 = Parameter(rng.standard_normal((channels, 3 * channels)) / math.sqrt(channels))
        self.b1 = Parameter(rng.standard_normal(3 * channels))
        self.w2 = Parameter(rng.standard_normal((3 * channels, channels)) / 3)
        self.b2 = Parameter(rng.standard_normal(channels))
        self.scale = Parameter(rng.uniform(0.5, 1.5, (channels, 1, 1)))
        self.norm_scale = Parameter(rng.uniform(0.5, 1.5, channels))
        self.norm_bias = Parameter(rng.standard_normal(channels))

    def forward(self, x):
        h = ops.transpose(self.conv(x), (0, 2, 3, 1))
        h = ops.layer_norm(h, self.norm_scale, self.norm_bias, eps=1e-6)
        h = ops.matmul(h, self.w1) + self.b1
        h = h * (ops.erf(h / math.sqrt(2)) + 1) * 0.5
        h = ops.matmul(h, self.w2) + self.b2
        return x + ops.transpose(h, (0, 3, 1, 2)) * self.scale


def block_plan(rng, shape=(2, 5, 7, 9), device="numpy"):
    model = ConvNeXtBlock(shape[1], rng).to(device).eval()
    x = gf.tensor(rng.standard_normal(shape), device=device)
    return model, x, InferencePlan(model, x.shape, device=device)


def test_convnext_block_fuses_bias_gelu_and_the_transposed_epilogue(rng):
    model, x, plan = block_plan(rng)
    fused = [s for s in plan.program.steps if s.name == "fused_elementwise"]
    assert [s.fused for s in fused] == [
        ("add", "affine", "erf", "affine", "mul", "affine"),
        ("add", "transpose", "mul", "add")]
    # bias + GELU reads the product and b1; the epilogue the product, b2, the scale, x.
    assert [len(s.inputs) for s in fused] == [2, 4]
    # The first transpose went into the layer norm, the second into the epilogue.
    assert "transpose" not in [s.name for s in plan.program.steps]
    assert [s.fused for s in plan.program.steps if s.name == "layer_norm"] == [
        ("transpose", "layer_norm")]
    with gf.no_grad():
        expected = model(x).numpy()
    assert relative_error(plan(x).numpy(), expected) < 1e-6


class LayerNorm2d(Module):
    """torchvision's LayerNorm2d as exported: to channels last, the layer norm, back."""

    def __init__(self, channels, rng):
        super().__init__()
        self.scale = Parameter(rng.uniform(0.5, 1.5, channels))
        self.bias = Parameter(rng.standard_normal(channels))

    def forward(self, x):
        h = ops.layer_norm(ops.transpose(x, (0, 2, 3, 1)), self.scale, self.bias, eps=1e-6)
        return ops.relu(ops.transpose(h, (0, 3, 1, 2)))


@pytest.mark.parametrize("device", ["numpy", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_layer_norm_2d_is_one_step(rng, device):
    model = LayerNorm2d(6, rng).to(device).eval()
    x = gf.tensor(rng.standard_normal((2, 6, 5, 7)) * 2 + 1, device=device)
    plan = InferencePlan(model, x.shape, device=device)
    assert [(s.name, s.fused) for s in plan.program.steps] == [
        ("layer_norm", ("transpose", "layer_norm", "transpose")), ("relu", ())]
    with gf.no_grad():
        expected = model(x).numpy()
    assert relative_error(plan(x).numpy(), expected) <= (1e-6 if device == "numpy" else 1e-5)


def test_a_transpose_read_twice_stays(rng):
    class Both(LayerNorm2d):
        def forward(self, x):
            h = ops.layer_norm(ops.transpose(x, (0, 2, 3, 1)), self.scale, self.bias)
            return ops.transpose(h, (0, 3, 1, 2)), h
    model = Both(4, rng).eval()
    x = gf.tensor(rng.standard_normal((2, 4, 3, 5)))
    plan = InferencePlan(model, x.shape)
    assert [s.name for s in plan.program.steps] == ["layer_norm", "transpose"]
    got, expected = plan(x), model(x)
    assert all(relative_error(g.numpy(), e.numpy()) < 1e-6 for g, e in zip(got, expected))


def test_a_value_read_outside_the_chain_is_computed_and_kept(rng):
    class Shared(Module):
        def forward(self, x):
            y = ops.exp(x) * 2
            return ops.sigmoid(y) + y, y
    x = gf.tensor(rng.standard_normal((3, 4)))
    plan = InferencePlan(Shared().eval(), x.shape)
    # y is an output too: it is made once, and the sigmoid chain reads it.
    assert [s.fused for s in plan.program.steps] == [("exp", "affine"), ("sigmoid", "add")]
    got = plan(x)
    y = np.exp(x.numpy()) * 2
    assert relative_error(got[0].numpy(), 1 / (1 + np.exp(-y)) + y) < 1e-6
    assert relative_error(got[1].numpy(), y) < 1e-6


def test_chains_of_other_shapes_stay_apart(rng):
    class Broadcast(Module):
        def forward(self, x):
            row = ops.exp(ops.mean(x, (0,), True))     # (1, 5): broadcast by the add
            return ops.relu(x + row * 3)
    x = gf.tensor(rng.standard_normal((4, 5)))
    plan = InferencePlan(Broadcast().eval(), x.shape)
    assert [s.fused for s in plan.program.steps if s.name == "fused_elementwise"] == [
        ("exp", "affine"), ("add", "relu")]
    with gf.no_grad():
        expected = Broadcast()(x).numpy()
    assert relative_error(plan(x).numpy(), expected) < 1e-6


def test_long_chains_split_at_the_kernel_limit(rng):
    class Long(Module):
        def forward(self, x):
            for _ in range(40):
                x = ops.affine(ops.sigmoid(x), 2.0, -1.0)
            return x
    x = gf.tensor(rng.standard_normal((3, 4)))
    plan = InferencePlan(Long().eval(), x.shape)
    lengths = [len(s.call.instructions) for s in plan.program.steps]
    assert max(lengths) <= 16 and sum(lengths) == 80
    with gf.no_grad():
        expected = Long()(x).numpy()
    assert relative_error(plan(x).numpy(), expected) < 1e-6


def test_a_chain_whose_own_operands_do_not_fit_takes_nothing_in(rng):
    class Wide(Module):
        """Six products, then an add through a transpose: eight inputs fuse; the last add
        (a ninth input) cannot join them and stays on its own."""

        def __init__(self):
            super().__init__()
            self.factors = [Parameter(rng.standard_normal((4, 5))) for _ in range(6)]
            for k, p in enumerate(self.factors):
                setattr(self, f"factor{k}", p)
            self.q1 = Parameter(rng.standard_normal((5, 4)))
            self.q2 = Parameter(rng.standard_normal((4, 5)))

        def forward(self, x):
            for p in self.factors:
                x = x * p
            y = ops.transpose(x, (1, 0)) + self.q1
            return ops.transpose(y, (1, 0)) + self.q2
    model = Wide().eval()
    x = gf.tensor(rng.standard_normal((4, 5)))
    plan = InferencePlan(model, x.shape)
    assert [(s.name, len(s.inputs)) for s in plan.program.steps] == [
        ("fused_elementwise", 8), ("transpose", 1), ("add", 2)]
    with gf.no_grad():
        expected = model(x).numpy()
    assert relative_error(plan(x).numpy(), expected) < 1e-6


def test_program_limits_are_refused_by_name():
    with pytest.raises(ValueError, match="fused_elementwise: 9 inputs"):
        FusedElementwise((2,), [(1,)] * 9, [Instruction(AddOp(), (0, 1))])
    with pytest.raises(ValueError, match="fused_elementwise: 0 instructions"):
        FusedElementwise((2,), [(1,)], [])
    with pytest.raises(ValueError, match="input 0 has 1 strides for an output of shape"):
        FusedElementwise((2, 3), [(1,)], [Instruction(AddOp(), (0, 0))])
    with pytest.raises(ValueError, match=r"instruction 0 reads registers \(0, 1\)"):
        FusedElementwise((2,), [(1,)], [Instruction(AddOp(), (0, 1))])
    program = FusedElementwise((2,), [(1,), (1,)], [Instruction(AddOp(), (0, 1))])
    with pytest.raises(TypeError, match="expected 2 input tensors, got 1"):
        program(gf.zeros((2,)))


@pytest.mark.parametrize("divisor", [1, 2, 3, 7, 49, 96, 3136, 65535, 100003, 2 ** 30 + 3,
                                     2 ** 31 - 1])
def test_division_constants_split_every_index(rng, divisor):
    magic, shift = division_constants(divisor)
    assert 0 < magic < 2 ** 32
    n = np.concatenate([rng.integers(0, 2 ** 31, 4000), [0, 1, divisor - 1, divisor, 2 ** 31 - 1,
                                                         (2 ** 31 - 1) // divisor * divisor]])
    n = n[n < 2 ** 31].astype(object)       # exact integers: the kernel's 32-bit arithmetic
    quotient = [((x * magic >> 32) + x) % 2 ** 32 >> shift for x in n]
    assert quotient == [x // divisor for x in n]


def gelu_program(shape):
    """x * 0.5 * (1 + erf((x + bias) / sqrt 2)), bias broadcast along the last axis,
    x read transposed: a (shape[0], shape[2], shape[1]) array seen as ``shape``."""
    n, rows, cols = shape
    return FusedElementwise(shape, [(rows * cols, 1, rows), (0, 0, 1)], [
        Instruction(AddOp(), (0, 1)),                       # r2 = x + bias
        Instruction(AffineOp(1 / math.sqrt(2), 0.0), (2,)),
        Instruction(ErfOp(), (3,)),
        Instruction(AffineOp(0.5, 0.5), (4,)),
        Instruction(MulOp(), (2, 5))])


def test_numpy_program_reads_through_its_strides(rng):
    x = rng.standard_normal((2, 7, 5)).astype(np.float32)
    bias = rng.standard_normal(7).astype(np.float32)
    got = gelu_program((2, 5, 7))(gf.tensor(x), gf.tensor(bias)).numpy()
    h = np.transpose(x, (0, 2, 1)) + bias
    erf = np.vectorize(math.erf)
    assert relative_error(got, h * 0.5 * (1 + erf(h / math.sqrt(2)))) < 1e-6


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("storage", [(), (("STORAGE_BF16", 1),)], ids=["float32", "bf16"])
def test_generated_program_compiles_without_warnings(tmp_path, storage):
    program = gelu_program((2, 5, 7))
    assert "op_erf(r3, 0.0f, 0.0f)" in program.program_source()
    source = tmp_path / "elementwise.cu"
    source.write_text(expand_source(SOURCE))
    defines = storage + (("FUSED_INPUTS", 2), ("FUSED_PROGRAM", program.program_source()))
    result = subprocess.run(
        ["nvcc", "-arch=sm_90", "--cubin", "-Werror", "all-warnings", *nvcc_options(defines),
         "-o", str(tmp_path / "out.cubin"), str(source)], capture_output=True, text=True,
        timeout=300)
    assert result.returncode == 0, result.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 5, 7), (3, 33, 65), (1, 1, 1)])
def test_cuda_program_matches_the_numpy_operators(rng, shape):
    n, rows, cols = shape
    x = rng.standard_normal((n, cols, rows)).astype(np.float32)
    bias = rng.standard_normal(cols).astype(np.float32)
    program = gelu_program(shape)
    expected = program(gf.tensor(x), gf.tensor(bias)).numpy()
    got = program(gf.tensor(x, device="cuda"), gf.tensor(bias, device="cuda"))
    assert got.device == "cuda" and got.shape == shape
    assert relative_error(got.numpy(), expected) <= 1e-5


def bias_gelu_program(shape):
    """gelu_program with x read as it lies (contiguous): the vector kernel's case."""
    program = gelu_program(shape)
    return FusedElementwise(shape, [contiguous_strides(shape), (0, 0, 1)],
                            [i for i in program.instructions])


def test_vector_layout_where_every_input_steps_by_one_or_zero():
    layout = np.frombuffer(bias_gelu_program((2, 5, 8)).layout_bytes(4), np.uint32)
    words = layout.reshape(3 + MAX_INPUTS, 6)
    # (2, 5, 8) merges to (10, 8) for x (8, 1) and the bias (0, 1): 10 x 2 vectors.
    assert list(words[0]) == [1, 1, 1, 1, 10, 2]
    assert list(words[1][-2:]) == [8, 4] and list(words[2][-2:]) == [0, 4]
    assert vector_problem([1, 1, 1, 1, 10, 8], [(0, 0, 0, 0, 8, 1), (0, 0, 0, 0, 0, 1)], 4) is None


@pytest.mark.parametrize("dims, strides, reason", [
    ([1, 1, 1, 1, 10, 6], [(0, 0, 0, 0, 6, 1)], "not a multiple of 4"),
    ([1, 1, 1, 1, 8, 8], [(0, 0, 0, 0, 1, 8)], "steps by 8"),
    ([1, 1, 1, 1, 3, 8], [(0, 0, 0, 0, 10, 1)], "aligned")])
def test_no_vector_layout_where_a_vector_would_straddle(dims, strides, reason):
    assert reason in vector_problem(dims, strides, 4)


def test_transposed_programs_keep_the_scalar_kernel():
    assert gelu_program((2, 5, 8)).layout_bytes(4) is None
    assert gelu_program((2, 5, 8)).layout_bytes() is not None


def test_inputs_read_transposed_are_staged():
    # gelu_program reads x [n, cols, rows] for a [n, rows, cols] result: x steps by 1 along
    # rows, by rows along cols; the bias is broadcast along rows.
    dims, strides = merged_layout((2, 5, 7), [[35, 1, 5], [0, 0, 1]])
    assert staged_inputs(dims, strides) == 0b01
    dims, strides = merged_layout((2, 5, 8), [[40, 8, 1], [0, 0, 1]])
    assert staged_inputs(dims, strides) == 0
    dims, strides = merged_layout((6, 9), [[9, 1], [1, 6]])     # the second, transposed
    assert staged_inputs(dims, strides) == 0b10


def transposed_pair_program(shape):
    """(a + b^T) * c + d over [n, rows, cols]: a and d as they lie, b and c read
    transposed (two staged inputs), d broadcast along rows."""
    n, rows, cols = shape
    return FusedElementwise(shape, [(rows * cols, cols, 1), (rows * cols, 1, rows),
                                    (rows * cols, 1, rows), (cols, 0, 1)], [
        Instruction(AddOp(), (0, 1)), Instruction(MulOp(), (4, 2)), Instruction(AddOp(), (5, 3))])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bf16"])
@pytest.mark.parametrize("shape", [(3, 33, 65), (2, 32, 32), (1, 7, 100), (5, 97, 1)], ids=str)
def test_cuda_staged_program_matches_the_numpy_operators(rng, shape, dtype):
    n, rows, cols = shape
    arrays = [rng.standard_normal(s).astype(np.float32)
              for s in ((n, rows, cols), (n, cols, rows), (n, cols, rows), (n, cols))]
    program = transposed_pair_program(shape)
    on_gpu = [gf.tensor(a, device="cuda") for a in arrays]
    if dtype == "bf16":
        on_gpu = [t.astype("bf16") for t in on_gpu]
        arrays = [t.astype("float32").numpy() for t in on_gpu]
    expected = program(*[gf.tensor(a) for a in arrays]).numpy()
    got = program(*on_gpu)
    assert got.shape == shape and got.dtype == on_gpu[0].dtype
    tolerance = 1e-5 if dtype == "float32" else 8e-3
    assert relative_error(got.astype("float32").numpy(), expected) <= tolerance


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bf16"])
@pytest.mark.parametrize("shape", [(3, 7, 16), (2, 33, 72), (1, 1, 8)])
def test_cuda_vector_program_matches_the_numpy_operators(rng, shape, dtype):
    x = rng.standard_normal(shape).astype(np.float32)
    bias = rng.standard_normal(shape[-1]).astype(np.float32)
    program = bias_gelu_program(shape)
    x_gpu, bias_gpu = gf.tensor(x, device="cuda"), gf.tensor(bias, device="cuda")
    if dtype == "bf16":
        # Both inputs rounded to bf16 first: the reference sees what the kernel reads.
        x_gpu, bias_gpu = x_gpu.astype("bf16"), bias_gpu.astype("bf16")
        x, bias = x_gpu.astype("float32").numpy(), bias_gpu.astype("float32").numpy()
    assert program.layout_bytes(16 // x_gpu.data.dtype.itemsize) is not None
    expected = program(gf.tensor(x), gf.tensor(bias)).numpy()
    got = program(x_gpu, bias_gpu)
    assert got.shape == shape and got.dtype == x_gpu.dtype
    tolerance = 1e-5 if dtype == "float32" else 8e-3      # bf16's rounding of the result
    assert relative_error(got.astype("float32").numpy(), expected) <= tolerance


@pytest.mark.gpu
def test_cuda_vector_program_falls_back_at_an_unaligned_address(rng):
    shape = (4, 9, 12)
    x = rng.standard_normal(math.prod(shape) + 1).astype(np.float32)
    bias = rng.standard_normal(shape[-1]).astype(np.float32)
    program = bias_gelu_program(shape)
    whole = gf.tensor(x, device="cuda")
    view = Tensor.wrap(whole.data.offset(1, shape), "cuda")     # 4 bytes past alignment
    expected = program(gf.tensor(x[1:].reshape(shape)), gf.tensor(bias)).numpy()
    got = program(view, gf.tensor(bias, device="cuda")).numpy()
    assert relative_error(got, expected) <= 1e-5


@pytest.mark.gpu
def test_cuda_program_covers_every_opcode(rng):
    x = gf.tensor(rng.uniform(0.2, 0.8, (3, 37)))
    y = gf.tensor(rng.uniform(1.1, 1.9, (3, 37)))
    for name in OPCODES:
        if name in ("add", "sub", "mul", "div"):
            call, operands = registry.get(name)(), (0, 1)
        elif name in ("pow", "clamp", "affine"):
            call, operands = registry.get(name)(*{"pow": (1.5,), "clamp": (0.3, 0.6),
                                                  "affine": (2.0, -1.0)}[name]), (0,)
        else:
            call, operands = registry.get(name)(), ((1,) if name == "acosh" else (0,))
        program = FusedElementwise((3, 37), [(37, 1), (37, 1)], [Instruction(call, operands)])
        expected = program(x, y).numpy()
        got = program(x.to("cuda"), y.to("cuda")).numpy()
        assert relative_error(got, expected) <= 1e-5, name


@pytest.mark.gpu
def test_empty_output_on_cuda_launches_nothing():
    program = FusedElementwise((0, 3), [(3, 1)], [Instruction(AffineOp(2.0, 1.0), (0,))])
    got = program(gf.zeros((0, 3), device="cuda"))
    assert got.device == "cuda" and got.shape == (0, 3)


@pytest.mark.gpu
def test_convnext_block_bf16_plan_fuses_and_stays_near_float32(rng):
    model, x, plan = block_plan(rng, shape=(2, 8, 9, 11))
    model = model.to("cuda")
    expected = InferencePlan(model, x.shape, device="cuda")(x.to("cuda")).numpy()
    half = InferencePlan(model, x.shape, device="cuda", dtype="bf16")
    assert [s.name for s in half.program.steps].count("fused_elementwise") == 2
    assert relative_error(half(x.to("cuda")).numpy(), expected) <= 1e-2


@pytest.mark.gpu
def test_convnext_block_plan_on_cuda_matches_numpy(rng):
    model, x, plan = block_plan(rng, shape=(3, 6, 11, 13))
    expected = plan(x).numpy()
    cuda_plan = InferencePlan(model.to("cuda"), x.shape, device="cuda")
    names = [s.name for s in cuda_plan.program.steps]
    assert names.count("fused_elementwise") == 2 and "transpose" not in names
    assert relative_error(cuda_plan(x.to("cuda")).numpy(), expected) <= 1e-5


# ----------------------------------------------------- a concatenated input --
def concat_program(shape, widths, axis=1, register=1):
    """relu(x * s + t) with x the concatenation of parts of ``widths`` along ``axis`` (at
    ``register``), s broadcast along ``axis`` only and t a full array: DenseNet's batch norm
    and ReLU after a concatenation, plus an input read at every element."""
    along = [0] * len(shape)
    along[axis] = 1
    strides = [along, contiguous_strides(shape)]
    strides.insert(register, contiguous_strides(shape))
    s_register, t_register = [k for k in range(3) if k != register]
    n = 3
    return FusedElementwise(shape, strides, [
        Instruction(MulOp(), (register, s_register)),
        Instruction(AddOp(), (n, t_register)),
        Instruction(registry.get("relu")(), (n + 1,))],
        ConcatInput(register, axis, tuple(widths), ConcatOp(axis)))


def concat_case(rng, shape, widths, axis=1, register=1, device="numpy"):
    """The program, its inputs (the other registers', then the parts) and the expected result."""
    parts = []
    for w in widths:
        part_shape = list(shape)
        part_shape[axis] = w
        parts.append(rng.standard_normal(part_shape).astype(np.float32))
    s = rng.standard_normal(shape[axis]).astype(np.float32)
    t = rng.standard_normal(shape).astype(np.float32)
    view = [1] * len(shape)
    view[axis] = shape[axis]
    expected = np.maximum(np.concatenate(parts, axis) * s.reshape(view) + t, 0)
    others = [s.reshape(view), t]
    inputs = [gf.tensor(a, device=device) for a in others + parts]
    return concat_program(shape, widths, axis, register), inputs, expected


@pytest.mark.parametrize("register", [0, 1, 2])
def test_numpy_program_with_a_concatenated_input(rng, register):
    program, inputs, expected = concat_case(rng, (2, 9, 5, 3), (3, 4, 2), register=register)
    assert relative_error(program(*inputs).numpy(), expected) < 1e-6


def test_concatenated_input_limits_are_refused_by_name():
    shape = (2, 6, 3)
    with pytest.raises(ValueError, match=r"a concatenation of 2 parts \(2, 3\) along axis 1"):
        concat_program(shape, (2, 3))
    with pytest.raises(ValueError, match="1 to 64 parts"):
        concat_program((2, MAX_CONCAT_PARTS + 1, 3), (1,) * (MAX_CONCAT_PARTS + 1))
    with pytest.raises(ValueError, match="an axis of at most 4096"):
        concat_program((1, 4097, 2), (4000, 97))
    with pytest.raises(ValueError, match="read as it lies"):
        FusedElementwise(shape, [(1, 2, 12)], [Instruction(registry.get("relu")(), (0,))],
                         ConcatInput(0, 1, (6,), ConcatOp(1)))
    image = (2, 6, 5, 3)          # another input with its inner axes transposed
    with pytest.raises(ValueError, match="must step over the axes before it and after it"):
        FusedElementwise(image, [contiguous_strides(image), (90, 15, 1, 5)],
                         [Instruction(AddOp(), (0, 1))], ConcatInput(0, 1, (6,), ConcatOp(1)))
    program, inputs, _ = concat_case(np.random.default_rng(0), shape, (2, 4))
    with pytest.raises(TypeError, match="expected 4 input tensors, got 3"):
        program(*inputs[:3])
    with pytest.raises(gf.ShapeError, match=r"concatenated part 1 has shape \(2, 3, 3\), "
                                            r"expected \(2, 4, 3\)"):
        program(*inputs[:3], gf.zeros((2, 3, 3)))
    with pytest.raises(ValueError, match="a concatenation of 2 parts"):
        concat_program(shape, (7, -1))


def test_concat_layout_is_the_c_struct():
    # struct ConcatProgramLayout in elementwise.cu: 64 pointers, 65 ints, 8x3 ints, 4
    # unsigned; 868 bytes of fields, padded to the pointers' 8-byte alignment.
    fields = CONCAT_LAYOUT.fields
    assert [fields[name][1] for name in ("part", "start", "strides", "division")] == [
        0, 512, 772, 868]
    assert CONCAT_LAYOUT.itemsize == 888 and _CONCAT_ARGUMENTS.endswith("888s")


@pytest.mark.parametrize("shape,strides,axis,expected", [
    ((2, 6, 5, 3), (90, 15, 3, 1), 1, (90, 15, 1)),      # contiguous
    ((2, 6, 5, 3), (0, 1, 0, 0), 1, (0, 1, 0)),          # per channel
    ((1, 6, 5, 3), (7, 15, 3, 1), 1, (0, 15, 1)),        # a size-1 axis takes no step
    ((2, 6, 5, 3), (90, 15, 1, 5), 1, None),             # the inner axes transposed
    ((2, 3, 4, 6), (1, 2, 6, 24), 3, None),              # the outer axes transposed
    ((4, 3, 6), (18, 6, 1), 0, (0, 18, 1)),
    ((4, 3, 6), (18, 6, 1), 2, (6, 1, 0)),
])
def test_axis_strides(shape, strides, axis, expected):
    assert axis_strides(shape, strides, axis) == expected


@pytest.mark.gpu
@pytest.mark.parametrize("shape,widths,axis,register", [
    ((2, 9, 5, 3), (3, 4, 2), 1, 1),
    ((3, 70, 7, 7), (6, 32, 32), 1, 0),                   # DenseNet-like, odd planes
    ((2, 64, 13, 11), (1,) * 64, 1, 2),                   # the most parts a kernel takes
    ((5, 65, 33), (10, 23), 2, 1),                        # the last axis: lines of one
    ((7, 3, 37), (2, 5), 0, 1),                           # the first axis: one line
    ((1, 40, 56, 56), (24, 16), 1, 1),                    # long lines
])
def test_cuda_program_with_a_concatenated_input_matches_numpy(rng, shape, widths, axis,
                                                            register):
    program, inputs, expected = concat_case(rng, shape, widths, axis, register)
    assert relative_error(program(*inputs).numpy(), expected) < 1e-6
    got = program(*[x.to("cuda") for x in inputs])
    assert got.device == "cuda" and got.shape == shape
    assert relative_error(got.numpy(), expected) <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("mixed", [False, True], ids=["bf16", "bf16_parts_float32_constants"])
def test_cuda_program_with_a_concatenated_16_bit_input(rng, mixed):
    # All bf16, or bf16 parts beside float32 constants: within bf16 rounding of float32.
    program, inputs, expected = concat_case(rng, (2, 12, 9, 7), (4, 8))
    cuda_inputs = [x.to("cuda") if mixed and k < 2 else x.to("cuda").astype("bf16")
                   for k, x in enumerate(inputs)]
    got = program(*cuda_inputs)
    # float32, as the concatenation it replaces computes (16-bit parts widened).
    assert got.dtype == np.float32
    assert relative_error(got.numpy(), expected) <= 2e-2


class DenseBlock(Module):
    """Three DenseNet layers: concat -> batch norm -> relu -> conv, the features growing."""

    def __init__(self, rng):
        super().__init__()
        for k in range(3):
            setattr(self, f"norm{k}", nn.BatchNorm2d(8 + 4 * k))
            setattr(self, f"conv{k}", nn.Conv2d(8 + 4 * k, 4, 3, padding=1, rng=rng))

    def forward(self, x):
        features = [x]
        for k in range(3):
            norm, conv = getattr(self, f"norm{k}"), getattr(self, f"conv{k}")
            features.append(conv(ops.relu(norm(ops.concat(features, 1)))))
        return ops.concat(features, 1)


@pytest.mark.parametrize("device", ["numpy", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_densenet_like_plan_reads_the_parts(rng, device):
    model = randomize_batch_norms(DenseBlock(rng).to("numpy"), rng).eval()
    x = rng.standard_normal((3, 8, 11, 9))
    with gf.no_grad():
        expected = model(gf.tensor(x, device="numpy")).numpy()
    model = model.to(device)
    plan = InferencePlan(model, x.shape, device=device)
    # Each layer's concatenation is read in place by its batch norm and relu; the block's
    # output concatenation is the plan's result and stays.
    assert plan.stats["fused_concatenation"] == 3
    assert [s.name for s in plan.program.steps].count("concat") == 1
    assert relative_error(plan(gf.tensor(x, device=device)).numpy(), expected) <= 1e-5
