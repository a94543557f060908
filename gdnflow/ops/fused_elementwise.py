"""One kernel for a chain of elementwise operators: what an inference plan's
elementwise fusion (:func:`gdnflow.inference.passes.fuse_elementwise`) runs.

CUDA kernel: ``fused_elementwise`` in ``cuda_src/elementwise.cu`` (section
"fused programs"). A :class:`FusedElementwise` is a straight-line program over
registers: registers 0 ... k-1 hold its k inputs, each read through element
strides over the output's shape (0 where the input is broadcast, permuted
where a transpose was folded in), and each :class:`Instruction` applies one
of the unary operators of :mod:`gdnflow.ops.elementwise` and
:mod:`gdnflow.ops.special` or the binary arithmetic of
:mod:`gdnflow.ops.arithmetic` to earlier registers; the last register is the
result. The kernel interprets the program, so that one compiled kernel
serves every chain (no compilation at plan build).

Elsewhere, and where the inputs' dtypes differ, the program runs as what it
replaced: each instruction's original operator in turn, on the inputs
viewed as the strides say (on NumPy, the reference the GPU tests compare
against). It is an inference rewrite: it computes no gradients (the plans
it appears in record none); training runs the original operators.
"""
import dataclasses

import numpy as np

from gdnflow.autograd import Operator
from gdnflow.backends import cuda
from gdnflow.ops.arithmetic import BinaryOp
from gdnflow.ops.broadcast import merged_layout
from gdnflow.ops.elementwise import UnaryOp
from gdnflow.ops.shape import contiguous_strides, cuda_gather
from gdnflow.tensor import Tensor

SOURCE = "elementwise.cu"
#: The kernel's opcodes, in the order of elementwise.cu's ``UNARY_OPERATORS``
#: then ``BINARY_OPERATORS`` lists (tests/ops/test_fused_elementwise.py checks it).
OPCODES = ("neg", "exp", "log", "sqrt", "pow", "relu", "relu6", "sigmoid", "clamp", "affine",
           "erf", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh",
           "acosh", "atanh", "add", "sub", "mul", "div")
#: The kernel's limits (``PROGRAM_INPUTS``, ``PROGRAM_INSTRUCTIONS``, ``PROGRAM_DIMS``).
MAX_INPUTS, MAX_INSTRUCTIONS, DIMS = 8, 16, 6
_OPCODE = {name: code for code, name in enumerate(OPCODES)}
# The ElementwiseProgram struct: inputs, instructions, dims, strides, code, params.
_PROGRAM_WORDS = 2 + DIMS + MAX_INPUTS * DIMS + MAX_INSTRUCTIONS * 3 + MAX_INSTRUCTIONS * 2
_ARGUMENTS = "P" * (1 + MAX_INPUTS) + "i" + f"{_PROGRAM_WORDS * 4}s"


def fusible(call):
    """Whether the traced operator ``call`` can be an :class:`Instruction`: a unary operator
    or binary arithmetic running its elementwise.cu kernels."""
    if isinstance(call, UnaryOp):
        return call.kernel in _OPCODE and type(call).forward_cuda is UnaryOp.forward_cuda
    return isinstance(call, BinaryOp) and call.kernel in _OPCODE


@dataclasses.dataclass(frozen=True)
class Instruction:
    """``registers[next] = call(registers[operands[0]], ...)``; ``call`` a traced operator
    that :func:`fusible` accepts."""

    call: Operator
    operands: tuple


class FusedElementwise:
    """A program of elementwise operators run as one pass (module docstring).

    ``shape``: the output's shape; ``strides``: per input, its element
    strides over the output's dimensions (of the input's contiguous array);
    ``instructions``: the program, in order. Called with the input tensors;
    returns a new tensor of ``shape``.
    """

    def __init__(self, shape, strides, instructions):
        self.shape = tuple(shape)
        self.strides = tuple(tuple(int(s) for s in st) for st in strides)
        self.instructions = tuple(instructions)
        if not 0 < len(self.strides) <= MAX_INPUTS:
            raise ValueError(f"fused_elementwise: {len(self.strides)} inputs; the kernel takes "
                             f"1 to {MAX_INPUTS}")
        if not 0 < len(self.instructions) <= MAX_INSTRUCTIONS:
            raise ValueError(f"fused_elementwise: {len(self.instructions)} instructions; the "
                             f"kernel takes 1 to {MAX_INSTRUCTIONS}")
        self._program = None

    def __repr__(self):
        names = " ".join(_name(i.call) for i in self.instructions)
        return f"FusedElementwise({names} over {len(self.strides)} inputs)"

    def __call__(self, *inputs):
        if (inputs[0].device == "cuda" and len({x.dtype for x in inputs}) == 1
                and self._fits_int32()):
            return Tensor.wrap(self._run_kernel([x.data for x in inputs]), "cuda")
        return self.reference(*inputs)

    def _fits_int32(self):
        return int(np.prod(self.shape)) < 2 ** 31

    def reference(self, *inputs):
        """The program as the original operators, one after the other."""
        registers = [self._view(x, strides) for x, strides in zip(inputs, self.strides)]
        for instruction in self.instructions:
            call = instruction.call
            registers.append(call(*[registers[r] for r in instruction.operands]))
            call.release()
        return registers[-1]

    def _view(self, x, strides):
        """``x`` read through ``strides`` at the output's shape, as a tensor of its own."""
        if list(strides) == contiguous_strides(self.shape):
            return x
        if x.device == "cuda":
            return Tensor.wrap(cuda_gather(x.data, self.shape, 0, strides), "cuda")
        array = np.ascontiguousarray(x.data)
        view = np.lib.stride_tricks.as_strided(
            array, self.shape, [s * array.itemsize for s in strides])
        return Tensor.wrap(np.ascontiguousarray(view), x.device)

    def program_bytes(self):
        """The kernel's ElementwiseProgram argument, packed (built once)."""
        if self._program is None:
            dims, strides = merged_layout(self.shape, [list(s) for s in self.strides])
            words = np.zeros(_PROGRAM_WORDS, np.int32)
            words[0], words[1] = len(strides), len(self.instructions)
            words[2:2 + DIMS] = dims
            at = 2 + DIMS
            for k, st in enumerate(strides):
                words[at + k * DIMS:at + (k + 1) * DIMS] = st
            at += MAX_INPUTS * DIMS
            code = words[at:at + MAX_INSTRUCTIONS * 3].reshape(MAX_INSTRUCTIONS, 3)
            params = np.zeros((MAX_INSTRUCTIONS, 2), np.float32)
            for t, instruction in enumerate(self.instructions):
                operands = tuple(instruction.operands) * (3 - len(instruction.operands))
                code[t] = (_OPCODE[instruction.call.kernel],) + operands[:2]
                if isinstance(instruction.call, UnaryOp):
                    params[t] = instruction.call.params
            words[at + MAX_INSTRUCTIONS * 3:] = params.ravel().view(np.int32)
            self._program = words.tobytes()
        return self._program

    def _run_kernel(self, arrays):
        out = cuda.empty(self.shape, arrays[0].dtype)
        pointers = [a.ptr for a in arrays] + [out.ptr] * (MAX_INPUTS - len(arrays))
        cuda.kernel(SOURCE, "fused_elementwise", _ARGUMENTS,
                    cuda.storage_defines(out.dtype)).launch(
            out.size, out.ptr, *pointers, out.size, self.program_bytes())
        return out


def _name(call):
    return call.kernel if call.kernel != "affine" else f"affine{call.params}"
