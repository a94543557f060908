"""Floating-point precision: the 16-bit dtypes, autocast, and their NumPy emulation.

gdnflow's tensors are float32 unless asked otherwise. On the CUDA backend a
tensor may also be ``float16`` or ``bfloat16``: half the bytes of float32, and
the tensor cores' operand types. The NumPy backend holds the same dtypes
(``numpy.float16`` and ml_dtypes' ``bfloat16``) and computes as the kernels do:
every value widened to float32, the operation in float32, the result rounded
once to the 16-bit dtype (:func:`emulate`). That makes it the oracle of the
16-bit kernels, as it is of the float32 ones.

Which operators run in 16 bits is each operator's class attribute
``autocast`` (see :class:`gdnflow.autograd.Operator`):

``"float32"`` (the default)
    no 16-bit kernels: a 16-bit input is refused with a
    :class:`~gdnflow.errors.DTypeError` naming the operator, and under
    :func:`autocast` it is widened to float32 first.
``"same"``
    16-bit kernels (elementwise maps, arithmetic, reshapes): runs in its
    inputs' dtype; under :func:`autocast`, inputs of mixed dtypes are all
    widened to float32.
``"lower"``
    products on the tensor cores (``matmul``, ``linear``, ``conv2d``,
    ``conv_transpose2d``): under :func:`autocast`, float32 inputs are rounded
    to the autocast dtype.
``"data"``
    16-bit kernels for the first input (the data), whose dtype the output
    takes, with float32 parameters beside it (``gdn``): the other inputs must
    be float32, and under :func:`autocast` 16-bit ones are widened to it.
``"exempt"``
    autocast leaves the inputs alone (``cast``, which does its conversions).

Inputs are converted by the ``cast`` operator, whose gradient converts back,
so parameters kept in float32 get float32 gradients (master weights).
"""
import contextlib

import ml_dtypes
import numpy as np

from gdnflow.errors import DTypeError

#: float32, every tensor's default dtype (``gdnflow.float32``).
FLOAT32 = np.dtype(np.float32)
#: IEEE half precision: 10 mantissa bits, largest value 65504 (``gdnflow.float16``).
FLOAT16 = np.dtype(np.float16)
#: bfloat16: 7 mantissa bits, float32's exponent range (``gdnflow.bfloat16``; ml_dtypes').
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
#: The 16-bit floating dtypes.
HALF_DTYPES = (FLOAT16, BFLOAT16)
#: The names :func:`as_dtype` accepts besides NumPy dtypes.
DTYPE_NAMES = {"fp32": FLOAT32, "float32": FLOAT32, "float": FLOAT32,
               "fp16": FLOAT16, "float16": FLOAT16, "half": FLOAT16,
               "bf16": BFLOAT16, "bfloat16": BFLOAT16,
               "fp64": np.dtype(np.float64), "float64": np.dtype(np.float64)}
#: The values of an operator's ``autocast`` attribute.
AUTOCAST_RULES = ("float32", "same", "lower", "data", "exempt")

#: The innermost active autocast block's dtype, or None. Read it with
#: :func:`autocast_dtype`; ``Operator.__call__`` reads the attribute itself (once per
#: operation: a function call there is a measurable share of a small operation's cost).
active_dtype = None


def as_dtype(dtype):
    """``dtype`` (a NumPy dtype or type, or a name such as ``"bf16"``) as a ``numpy.dtype``.

    Names: fp32/float32, fp16/float16/half, bf16/bfloat16, fp64/float64. An
    unknown name is a :class:`~gdnflow.errors.DTypeError` listing them.
    """
    if isinstance(dtype, str):
        named = DTYPE_NAMES.get(dtype.lower())
        if named is not None:
            return named
        try:
            return np.dtype(dtype)
        except TypeError:
            raise DTypeError(f"unknown dtype {dtype!r}; expected a NumPy dtype or one of "
                             f"{', '.join(DTYPE_NAMES)}") from None
    return np.dtype(dtype)


def is_half(dtype):
    """True for float16 and bfloat16."""
    return dtype in HALF_DTYPES


def emulate(compute, *arrays, dtype=None):
    """``compute(*arrays)`` as a 16-bit GPU kernel computes it, on NumPy arrays.

    If the first array is 16-bit, every array is widened to float32, ``compute``
    runs in float32 and its result (or each result of a tuple; None passes
    through) is rounded once to ``dtype`` (default: the first array's dtype),
    to nearest, ties to even. Otherwise ``compute(*arrays)`` as it is, its
    result converted to ``dtype`` where one is given.
    """
    first = arrays[0].dtype
    if first.itemsize != 2:     # not 16-bit (the only 2-byte dtypes a tensor has): as it is
        result = compute(*arrays)
        if dtype is None or getattr(result, "dtype", None) is dtype:
            return result
        return _convert(result, dtype)
    target = first if dtype is None else np.dtype(dtype)
    wide = [a.astype(FLOAT32) if a is not None and is_half(a.dtype) else a for a in arrays]
    return _convert(compute(*wide), target)


def _convert(result, dtype):
    if isinstance(result, tuple):
        return tuple(_convert(r, dtype) for r in result)
    with np.errstate(over="ignore"):    # past the dtype's largest: infinity, as on the GPU
        return None if result is None else np.asarray(result, dtype=dtype)


@contextlib.contextmanager
def autocast(dtype="bf16", enabled=True):
    """Within the block, operators choose their precision (PyTorch's ``torch.autocast``).

    ``dtype``: ``"bf16"`` (default; float32's range, no loss scaling needed)
    or ``"fp16"`` (more mantissa, narrower range: train it with
    :class:`gdnflow.optim.DynamicLossScaler`). Matrix products take 16-bit
    operands (float32 inputs are rounded), operators with 16-bit kernels
    run in their inputs' dtype (GDN too, its parameters float32), and every
    other operator (reductions, softmax, batch norm, the entropy model) runs
    in float32, its 16-bit inputs widened. Parameters stay float32 and get
    float32 gradients.
    ``enabled=False`` makes the block a no-op; blocks nest. The setting is
    the process's, as :func:`gdnflow.no_grad` is: run operators in one
    thread while a block is open.
    """
    global active_dtype
    if enabled:
        dtype = as_dtype(dtype)
        if not is_half(dtype):
            raise DTypeError(f"autocast: dtype must be bf16 or fp16, got {dtype}")
    previous = active_dtype
    active_dtype = dtype if enabled else None
    try:
        yield
    finally:
        active_dtype = previous


def autocast_dtype():
    """The dtype of the innermost active :func:`autocast` block, or None."""
    return active_dtype


def autocast_targets(rule, dtypes):
    """The dtype each input should have under autocast, or None where it stays.

    ``rule`` is the operator's ``autocast`` attribute, ``dtypes`` its inputs'
    dtypes; only float32 and 16-bit inputs are converted (float64 never).
    """
    target = active_dtype
    if rule == "exempt" or target is None:
        return None
    if rule == "lower":
        wanted = [target if d == FLOAT32 or is_half(d) else d for d in dtypes]
    elif rule == "same" and all(d == dtypes[0] for d in dtypes):
        return None             # one dtype: the operator's own kernels take it
    elif rule == "data":        # the data as it is, the parameters float32
        wanted = dtypes[:1] + [FLOAT32 if is_half(d) else d for d in dtypes[1:]]
    else:                       # "float32", or "same" with mixed dtypes: all float32
        wanted = [FLOAT32 if is_half(d) else d for d in dtypes]
    return None if list(wanted) == list(dtypes) else wanted


def check_rule(rule, label):
    """Refuse an operator class whose ``autocast`` attribute is not a known rule."""
    if rule not in AUTOCAST_RULES:
        raise ValueError(f"{label}: autocast must be one of {AUTOCAST_RULES}, got {rule!r}")
