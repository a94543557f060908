"""One kernel for a chain of elementwise operators: what an inference plan's
elementwise fusion (:func:`gdnflow.inference.passes.fuse_elementwise`) runs.

CUDA kernel: ``fused_program`` in ``cuda_src/elementwise.cu`` (section
"fused programs"). A :class:`FusedElementwise` is a straight-line program over
registers: registers 0 ... k-1 hold its k inputs, each read through element
strides over the output's shape (0 where the input is broadcast, permuted
where a transpose was folded in), and each :class:`Instruction` applies one
of the unary operators of :mod:`gdnflow.ops.elementwise` and
:mod:`gdnflow.ops.special` or the binary arithmetic of
:mod:`gdnflow.ops.arithmetic` to earlier registers; the last register is the
result. The program is written out as C statements
(:meth:`FusedElementwise.program_source`) and compiled into a module of its
own with ``-DFUSED_PROGRAM`` (once per program and dtype; the cubin cache
keeps it across processes): an interpreted version, one kernel for every
program, ran 5-7x slower on the H200 (its registers in local memory). Where
every input steps along the output's innermost axis by 1 or 0 and every
address is 16-byte aligned, ``fused_program_vector`` runs the same program
on 16 bytes of each input per thread (:func:`vector_problem` says when not);
where an input is read transposed (the output's innermost axis is not its
own), ``fused_program_staged`` reads it through a shared-memory tile
(:func:`staged_inputs`).

A program may read one of its inputs as a concatenation of several arrays
(:class:`ConcatInput`: DenseNet's batch norm and ReLU after each
concatenation): the kernel ``fused_concat_program`` reads that register from
the parts themselves (each element's part from a table of rows in shared
memory), so the concatenated tensor is never written.

On the GPU, inputs of mixed dtypes (a 16-bit activation beside a float32
constant, in a 16-bit plan) are widened and the program runs in float32,
as the operators it replaces compute mixed inputs. On NumPy (and past 2^31
elements) the program runs as what it replaced: each instruction's original
operator in turn, on the inputs viewed as the strides say (the reference
the GPU tests compare against). It is an inference rewrite: it computes no
gradients (the plans it appears in record none); training runs the original
operators.
"""
import dataclasses
import math

import numpy as np

from gdnflow.autograd import Operator
from gdnflow.backends import cuda
from gdnflow.backends.cuda.limits import division_constants
from gdnflow.errors import ShapeError
from gdnflow.ops.arithmetic import BinaryOp
from gdnflow.ops.broadcast import merged_layout
from gdnflow.ops.cast import cast_array
from gdnflow.ops.elementwise import UnaryOp
from gdnflow.ops.shape import contiguous_strides, cuda_gather
from gdnflow.precision import FLOAT32
from gdnflow.tensor import Tensor

SOURCE = "elementwise.cu"
#: The operators a program may use: elementwise.cu's ``UNARY_OPERATORS`` then
#: ``BINARY_OPERATORS`` (its ``op_<name>`` functions; tests/ops/test_fused_elementwise.py
#: checks the lists agree).
OPCODES = ("neg", "exp", "log", "sqrt", "pow", "relu", "relu6", "sigmoid", "clamp", "affine",
           "erf", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh",
           "acosh", "atanh", "add", "sub", "mul", "div")
#: The kernel's inputs and index dimensions (``PROGRAM_INPUTS``, ``PROGRAM_DIMS``), and
#: the longest program the pass writes (one kernel's worth of registers).
MAX_INPUTS, DIMS, MAX_INSTRUCTIONS = 8, 6, 16
#: Bytes a thread of ``fused_program_vector`` loads from each input and stores at once (its
#: StorageVector: 4 float32 or 8 16-bit values).
VECTOR_BYTES = 16
#: fused_program_staged's tile (STAGE_TILE rows by STAGE_TILE columns) and its block
#: (STAGE_TILE x STAGE_ROWS threads); its arguments: out, the inputs, rows, cols, the row and
#: column tile counts, the ProgramLayout.
STAGE_TILE, STAGE_ROWS = 32, 8
_STAGED_ARGUMENTS = "PPPPPPPPPiiii264s"
_OPCODES = frozenset(OPCODES)
# out, the inputs, n, then the ProgramLayout struct (dims, strides per input, magic numbers,
# shifts: (3 + MAX_INPUTS) * DIMS 4-byte fields); a constant, so that
# tests/test_cuda_sources.py checks it against the compiled kernel.
_ARGUMENTS = "PPPPPPPPPi264s"
#: Parts a concatenated input may have, and rows (its length along the concatenated
#: axis): CONCAT_PARTS and CONCAT_ROWS in elementwise.cu. fused_concat_program's
#: arguments: out, the inputs, the element count, total, inner, the part count, then the
#: ConcatProgramLayout struct (part pointers, start rows, three strides per input, the
#: division constants of inner and total: 888 bytes with its padding).
MAX_CONCAT_PARTS = 64
MAX_CONCAT_ROWS = 4096
_CONCAT_ARGUMENTS = "PPPPPPPPPiiii888s"
#: ConcatProgramLayout as the host packs it: NumPy's ``align=True`` lays fields out by C's
#: rules (tests/ops/test_fused_elementwise.py checks the size against _CONCAT_ARGUMENTS).
CONCAT_LAYOUT = np.dtype([("part", np.uint64, (MAX_CONCAT_PARTS,)),
                          ("start", np.int32, (MAX_CONCAT_PARTS + 1,)),
                          ("strides", np.int32, (MAX_INPUTS, 3)),
                          ("division", np.uint32, (4,))], align=True)


def fusible(call):
    """Whether the traced operator ``call`` can be an :class:`Instruction`: a unary operator
    or binary arithmetic running its elementwise.cu kernels."""
    if isinstance(call, UnaryOp):
        return call.kernel in _OPCODES and type(call).forward_cuda is UnaryOp.forward_cuda
    return isinstance(call, BinaryOp) and call.kernel in _OPCODES


@dataclasses.dataclass(frozen=True)
class ConcatInput:
    """Register ``register`` of a program is the concatenation of parts along ``axis`` of
    the output, part k being ``widths[k]`` long there; ``call`` is the traced concat
    operator (the reference runs it)."""

    register: int
    axis: int
    widths: tuple
    call: Operator


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
    ``instructions``: the program, in order; ``concat``: a :class:`ConcatInput`
    or None. Called with the input tensors (with ``concat``: those of the other
    registers in order, then the parts); returns a new tensor of ``shape``.
    """

    def __init__(self, shape, strides, instructions, concat=None):
        self.shape = tuple(shape)
        self.strides = tuple(tuple(int(s) for s in st) for st in strides)
        self.instructions = tuple(instructions)
        self.concat = concat
        if not 0 < len(self.strides) <= MAX_INPUTS:
            raise ValueError(f"fused_elementwise: {len(self.strides)} inputs; the kernel takes "
                             f"1 to {MAX_INPUTS}")
        if not 0 < len(self.instructions) <= MAX_INSTRUCTIONS:
            raise ValueError(f"fused_elementwise: {len(self.instructions)} instructions; a "
                             f"program has 1 to {MAX_INSTRUCTIONS}")
        for k, st in enumerate(self.strides):
            if len(st) != len(self.shape):
                raise ValueError(f"fused_elementwise: input {k} has {len(st)} strides for an "
                                 f"output of shape {self.shape}")
        for t, instruction in enumerate(self.instructions):
            if not all(0 <= r < len(self.strides) + t for r in instruction.operands):
                raise ValueError(f"fused_elementwise: instruction {t} reads registers "
                                 f"{instruction.operands}; only 0 to "
                                 f"{len(self.strides) + t - 1} are written before it")
        problem = None if concat is None else concat_input_problem(
            self.shape, self.strides, concat.register, concat.axis, concat.widths)
        if problem is not None:
            raise ValueError(f"fused_elementwise: {problem}")
        # dtype -> (kernel, packed layout); ("concat", dtype) -> kernel: made on first use
        self._launches = {}

    def __repr__(self):
        names = " ".join(_name(i.call) for i in self.instructions)
        concat = "" if self.concat is None else (
            f", input {self.concat.register} a concatenation of {len(self.concat.widths)} parts")
        return f"FusedElementwise({names} over {len(self.strides)} inputs{concat})"

    def __call__(self, *inputs):
        expected = len(self.strides) + (0 if self.concat is None
                                        else len(self.concat.widths) - 1)
        if len(inputs) != expected:
            raise TypeError(f"fused_elementwise: expected {expected} input tensors, "
                            f"got {len(inputs)}")
        if inputs[0].device == "cuda" and math.prod(self.shape) < 2 ** 31:
            arrays = [x.data for x in inputs]
            dtypes = {a.dtype for a in arrays}
            if len(dtypes) > 1 or (self.concat is not None and dtypes != {FLOAT32}):
                # float32 throughout for mixed dtypes (a 16-bit activation and a float32
                # constant, in a 16-bit plan), as the operators compute mixed inputs; and
                # for 16-bit parts of a concatenation, which computes in float32 (its
                # 16-bit inputs are widened under autocast).
                arrays = [cast_array(a, FLOAT32) for a in arrays]
            run = self._run_kernel if self.concat is None else self._run_concat_kernel
            return Tensor.wrap(run(arrays), "cuda")
        return self.reference(*inputs)

    def _registers(self, inputs):
        """The register inputs from the call's: with a concatenation, the other registers'
        in order, then the parts (their concatenation goes in its register)."""
        if self.concat is None:
            return list(inputs)
        r, others, axis = self.concat.register, len(self.strides) - 1, self.concat.axis
        parts = list(inputs[others:])
        for k, (part, width) in enumerate(zip(parts, self.concat.widths)):
            expected = self.shape[:axis] + (width,) + self.shape[axis + 1:]
            if tuple(part.shape) != expected:
                raise ShapeError(f"fused_elementwise: concatenated part {k} has shape "
                                 f"{tuple(part.shape)}, expected {expected}")
        return list(inputs[:r]) + [parts] + list(inputs[r:others])

    def reference(self, *inputs):
        """The program as the original operators, one after the other."""
        registers = self._registers(inputs)
        if self.concat is not None:
            r = self.concat.register
            registers[r] = self.concat.call(*registers[r])
            self.concat.call.release()
        registers = [self._view(x, strides) for x, strides in zip(registers, self.strides)]
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
            # The view kernels move float32: a 16-bit input is widened first.
            return Tensor.wrap(cuda_gather(cast_array(x.data, FLOAT32), self.shape, 0, strides),
                               "cuda")
        array = np.ascontiguousarray(x.data)
        view = np.lib.stride_tricks.as_strided(
            array, self.shape, [s * array.itemsize for s in strides])
        return Tensor.wrap(np.ascontiguousarray(view), x.device)

    def program_source(self):
        """The statements of the compiled kernel (``-DFUSED_PROGRAM``; see elementwise.cu)."""
        count = len(self.strides)
        lines = [f"const float r{k} = input{k};" for k in range(count)]
        for t, instruction in enumerate(self.instructions):
            call = instruction.call
            arguments = [f"r{r}" for r in instruction.operands]
            if isinstance(call, UnaryOp):
                arguments += [_float_literal(p) for p in call.params]
            lines.append(f"const float r{count + t} = op_{call.kernel}({', '.join(arguments)});")
        lines.append(f"result = r{count + len(self.instructions) - 1};")
        return " ".join(lines)

    def layout_bytes(self, vector=1):
        """The kernel's ProgramLayout argument: merged dimensions, strides and the dimensions'
        division constants (:func:`division_constants`), packed. With ``vector`` > 1, that of
        ``fused_program_vector`` moving ``vector`` elements a thread (its innermost dimension
        and strides counted in vectors), or None where the program's layout does not allow
        it (:func:`vector_problem`)."""
        dims, strides = merged_layout(self.shape, [list(s) for s in self.strides])
        if vector > 1:
            if vector_problem(dims, strides, vector) is not None:
                return None
            dims = dims[:-1] + [dims[-1] // vector]
            strides = [st[:-1] + (st[-1] * vector,) for st in strides]
        words = np.zeros((3 + MAX_INPUTS, DIMS), np.int64)
        words[0] = dims
        words[1:1 + len(strides)] = strides
        words[1 + MAX_INPUTS:] = np.transpose([division_constants(d) for d in dims])
        return words.astype(np.uint32).tobytes()

    def _run_concat_kernel(self, arrays):
        """fused_concat_program: the concatenated register read from its parts."""
        registers = self._registers(arrays)
        parts, axis = registers[self.concat.register], self.concat.axis
        dtype = parts[0].dtype
        out = cuda.empty(self.shape, dtype)
        total, inner = self.shape[axis], math.prod(self.shape[axis + 1:])
        if out.size == 0:
            return out
        if ("concat", dtype) not in self._launches:
            defines = (("FUSED_INPUTS", len(self.strides)), ("FUSED_CONCAT", self.concat.register),
                       ("FUSED_PROGRAM", self.program_source()))
            self._launches["concat", dtype] = cuda.kernel(
                SOURCE, "fused_concat_program", _CONCAT_ARGUMENTS,
                tuple(cuda.storage_defines(dtype)) + defines)
        kernel = self._launches["concat", dtype]
        layout = np.zeros((), CONCAT_LAYOUT)
        layout["part"][:len(parts)] = [a.ptr for a in parts]
        layout["start"][:len(parts) + 1] = np.cumsum((0,) + self.concat.widths)
        layout["strides"][:len(self.strides)] = [axis_strides(self.shape, st, axis)
                                                 for st in self.strides]
        layout["division"] = division_constants(inner) + division_constants(total)
        pointers = [out.ptr if k == self.concat.register else a.ptr
                    for k, a in enumerate(registers)]
        pointers += [out.ptr] * (MAX_INPUTS - len(pointers))
        kernel.launch(out.size, out.ptr, *pointers, out.size, total, inner, len(parts),
                      layout.tobytes())
        return out

    def _run_kernel(self, arrays):
        """fused_program_vector where the layout and every address allow, fused_program_staged
        where an input is read transposed (:func:`staged_inputs`), else fused_program."""
        dtype = arrays[0].dtype
        out = cuda.empty(self.shape, dtype)
        if out.size == 0:
            return out
        if dtype not in self._launches:
            self._launches[dtype] = self._kernels(dtype)
        kernel, layout, vector_kernel, vector_layout, staged = self._launches[dtype]
        pointers = [a.ptr for a in arrays] + [out.ptr] * (MAX_INPUTS - len(arrays))
        if vector_kernel is not None and all(p % VECTOR_BYTES == 0 for p in pointers):
            vectors = out.size * dtype.itemsize // VECTOR_BYTES
            vector_kernel.launch(vectors, out.ptr, *pointers, vectors, vector_layout)
        elif staged is not None:
            rows, cols, row_tiles, col_tiles, outer = staged
            kernel((outer * row_tiles * col_tiles, 1, 1), (STAGE_TILE, STAGE_ROWS, 1), out.ptr,
                   *pointers, rows, cols, row_tiles, col_tiles, layout)
        else:
            kernel.launch(out.size, out.ptr, *pointers, out.size, layout)
        return out

    def _kernels(self, dtype):
        """(kernel, its layout, the vector kernel or None, its layout, the staged kernel's
        (rows, cols, row tiles, col tiles, outer count) or None) for ``dtype``."""
        defines = tuple(cuda.storage_defines(dtype)) + (
            ("FUSED_INPUTS", len(self.strides)), ("FUSED_PROGRAM", self.program_source()))
        dims, strides = merged_layout(self.shape, [list(s) for s in self.strides])
        vector_layout = self.layout_bytes(VECTOR_BYTES // dtype.itemsize)
        vector_kernel = None if vector_layout is None else cuda.kernel(
            SOURCE, "fused_program_vector", _ARGUMENTS, defines)
        mask = staged_inputs(dims, strides)
        if not mask:
            return (cuda.kernel(SOURCE, "fused_program", _ARGUMENTS, defines), self.layout_bytes(),
                    vector_kernel, vector_layout, None)
        rows, cols = dims[-2], dims[-1]
        staged = (rows, cols, -(-rows // STAGE_TILE), -(-cols // STAGE_TILE), math.prod(dims[:-2]))
        return (cuda.kernel(SOURCE, "fused_program_staged", _STAGED_ARGUMENTS,
                            defines + (("FUSED_STAGED", mask),)),
                self.layout_bytes(), vector_kernel, vector_layout, staged)


def staged_inputs(dims, strides):
    """The bit mask of the inputs ``fused_program_staged`` reads through shared memory, for
    a program over merged ``dims`` read through ``strides`` (from :func:`merged_layout`): those
    stepping by 1 along the second innermost dimension and by more along the innermost (an
    input read transposed). 0 if there are none."""
    if dims[-2] == 1:
        return 0
    return sum(1 << k for k, st in enumerate(strides) if st[-2] == 1 and st[-1] not in (0, 1))


def vector_problem(dims, strides, vector):
    """Why fused_program_vector cannot run a program over merged ``dims`` read through
    ``strides`` (from :func:`merged_layout`) ``vector`` elements at a time, or None if it
    can: the innermost dimension must be a multiple of ``vector``, every input step along it
    by 1 or 0, and an input that steps by 1 start each vector on a multiple of ``vector``."""
    if dims[-1] % vector:
        return f"the innermost dimension, {dims[-1]}, is not a multiple of {vector}"
    for k, st in enumerate(strides):
        if st[-1] not in (0, 1):
            return f"input {k} steps by {st[-1]} along the innermost dimension"
        if st[-1] == 1 and any(s % vector for s in st[:-1]):
            return f"input {k}'s strides {tuple(st)} do not keep its vectors aligned"
    return None


def concat_input_problem(shape, strides, register, axis, widths):
    """Why register ``register`` (read through ``strides``, one tuple per input) cannot be
    a :class:`ConcatInput` of parts ``widths`` long along ``axis`` of ``shape``, or None
    if it can: the checks of :class:`FusedElementwise` and of the pass that makes them."""
    if not 0 <= register < len(strides) or not 0 <= axis < len(shape):
        return (f"a concatenated input at register {register}, axis {axis}: the program has "
                f"{len(strides)} inputs and {len(shape)} dimensions")
    if not 0 < len(widths) <= MAX_CONCAT_PARTS or min(widths) < 0 \
            or sum(widths) != shape[axis] or shape[axis] > MAX_CONCAT_ROWS:
        return (f"a concatenation of {len(widths)} parts {tuple(widths)} along axis {axis} of "
                f"{tuple(shape)}; the kernel takes 1 to {MAX_CONCAT_PARTS} parts filling an axis "
                f"of at most {MAX_CONCAT_ROWS}")
    if list(strides[register]) != contiguous_strides(shape):
        return ("a concatenated input is read as it lies (contiguous strides), not through "
                f"{tuple(strides[register])}")
    if any(axis_strides(shape, st, axis) is None for st in strides):
        return (f"with a concatenation along axis {axis}, every input must step over the axes "
                "before it and after it as one")
    return None


def axis_strides(shape, strides, axis):
    """(outer, axis, inner): one element stride each for the axes of ``shape`` before
    ``axis``, ``axis`` itself and the axes after it, read through ``strides``; None where
    the axes before it (or after it) are not stepped over as one."""
    def merged(dims, steps):
        kept = [(d, s) for d, s in zip(dims, steps) if d != 1]
        for (_, outer_step), (d, inner_step) in zip(kept, kept[1:]):
            if outer_step != inner_step * d:
                return None
        return kept[-1][1] if kept else 0
    outer = merged(shape[:axis], strides[:axis])
    inner = merged(shape[axis + 1:], strides[axis + 1:])
    return None if outer is None or inner is None else (outer, strides[axis], inner)


def _float_literal(value):
    """``value`` as a CUDA float literal (infinities by name)."""
    value = float(value)
    if math.isinf(value):
        return "INFINITY" if value > 0 else "-INFINITY"
    if math.isnan(value):
        return "__int_as_float(0x7fc00000)"
    return f"{value!r}f"


def _name(call):
    return call.kernel if call.kernel != "affine" else f"affine{call.params}"
