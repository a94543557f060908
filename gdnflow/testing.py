"""Checks for operator authors (built-in and plugin alike).

:func:`gradcheck` compares an operator's backward with central finite
differences in float64 on the NumPy backend. :func:`assert_backends_match`
runs one function on the CUDA backend (float32) and on NumPy (float64, as the
reference) from the same random inputs and compares outputs and gradients.
Both take ``fn(*tensors) -> Tensor`` and a list of NumPy input arrays.
"""
import contextlib

import ml_dtypes
import numpy as np

from gdnflow import precision
from gdnflow.autograd import no_grad
from gdnflow.backends import cuda
from gdnflow.tensor import Tensor


def _input_label(index, names):
    """How a failure names input ``index``: ``input 'theta'`` given ``names``, else ``input 1``."""
    return f"input {names[index]!r}" if names is not None else f"input {index}"


def _weighted_output(fn, arrays, weight):
    """sum(weight * fn(arrays)) in float64 on NumPy, without recording."""
    with no_grad():
        out = fn(*[Tensor(a, device="numpy", dtype=np.float64) for a in arrays]).numpy()
    return float(np.sum(weight * out))


def gradcheck(fn, inputs, *, requires_grad=None, eps=1e-6, rtol=1e-5, atol=1e-8,
              directions=2, full_jacobian_max=32, seed=0, names=None):
    """Assert that ``fn``'s gradients match central differences (float64, NumPy).

    The output is contracted with a random weight w, L = sum(w * fn(x)), and
    for every input that requires a gradient, dL/dx . d is compared with
    (L(x + eps d) - L(x - eps d)) / (2 eps) along ``directions`` random
    directions d, and element by element when the input has at most
    ``full_jacobian_max`` elements. Raises AssertionError naming the input
    (by its name in ``names``, one per input, where given; else by position)
    and the two values.
    """
    rng = np.random.default_rng(seed)
    arrays = [np.array(a, dtype=np.float64) for a in inputs]
    if requires_grad is None:
        requires_grad = [True] * len(arrays)
    tensors = [Tensor(a, device="numpy", dtype=np.float64, requires_grad=r)
               for a, r in zip(arrays, requires_grad)]
    out = fn(*tensors)
    weight = rng.standard_normal(out.shape)
    out.backward(Tensor(weight, device="numpy", dtype=np.float64))

    def loss_along(i, direction, step):
        moved = list(arrays)
        moved[i] = arrays[i] + step * direction
        return _weighted_output(fn, moved, weight)

    for i, (x, t) in enumerate(zip(arrays, tensors)):
        if not requires_grad[i]:
            continue
        analytic = t.grad.numpy() if t.grad is not None else np.zeros_like(x)
        checks = [rng.standard_normal(x.shape) for _ in range(directions)]
        if x.size <= full_jacobian_max:
            checks += [np.eye(x.size)[k].reshape(x.shape) for k in range(x.size)]
        for d in checks:
            numeric = (loss_along(i, d, eps) - loss_along(i, d, -eps)) / (2 * eps)
            predicted = float(np.sum(analytic * d))
            if not abs(numeric - predicted) <= atol + rtol * max(abs(numeric), abs(predicted)):
                where = (f"at element {tuple(int(k) for k in np.unravel_index(int(np.argmax(d)), x.shape))}"
                         if np.count_nonzero(d) == 1 else "along a random direction")
                raise AssertionError(
                    f"gradient of {_input_label(i, names)} (shape {x.shape}) {where}: backward "
                    f"gives {predicted:.10g}, finite differences {numeric:.10g}")


@contextlib.contextmanager
def _poisoned_allocations():
    runtime = cuda.get_runtime()
    previous, runtime.poison = runtime.poison, True
    try:
        yield
    finally:
        runtime.poison = previous


def round_to_tf32(x):
    """float32 ``x`` rounded to TF32 (the tensor cores' 10-bit mantissa), nearest, ties to even.

    The NumPy side of a "tf32" matmul check: a product of TF32-rounded
    inputs accumulated in float64 is what the tensor cores approximate.
    Infinities and NaN pass unchanged.
    """
    return _round_mantissa(x, 13)                   # float32's 23 mantissa bits - TF32's 10


def round_to_bfloat16(x):
    """float32 ``x`` rounded to bfloat16's 7-bit mantissa, nearest, ties to even, as float32.

    Computed on the bits, independently of ml_dtypes: an oracle for the
    ``cast`` operator and for :func:`gdnflow.precision.emulate`. Values past
    bfloat16's largest round to infinity; infinities and NaN pass unchanged.
    """
    return _round_mantissa(x, 16)


def _round_mantissa(x, dropped):
    """float32 ``x`` with its lowest ``dropped`` mantissa bits rounded away (nearest, even)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    half = np.uint32(1 << (dropped - 1)) - np.uint32(1) + ((bits >> dropped) & np.uint32(1))
    finite = (bits & np.uint32(0x7F800000)) != np.uint32(0x7F800000)
    rounded = np.where(finite, (bits + half) & ~np.uint32((1 << dropped) - 1), bits)
    return rounded.view(np.float32)


def units_in_last_place(actual, expected, dtype):
    """The largest difference of ``actual`` from ``expected``, in units of ``dtype``'s last place.

    Each element's difference is divided by the spacing of ``dtype``'s values
    at ``expected`` (at least the smallest normal's), so 1.0 means one
    rounding step of a 16-bit result. NaN where exactly one side is NaN counts
    as infinite; a shape mismatch too.
    """
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    if actual.shape != expected.shape:
        return float("inf")
    info = ml_dtypes.finfo(dtype) if dtype == precision.BFLOAT16 else np.finfo(dtype)
    nan = np.isnan(actual) | np.isnan(expected)
    if np.any(np.isnan(actual) != np.isnan(expected)):
        return float("inf")
    same = (actual == expected) | nan
    exponent = np.floor(np.log2(np.maximum(np.abs(expected), float(info.smallest_normal))))
    spacing = np.exp2(exponent) * float(info.eps)
    steps = np.where(same, 0.0, np.abs(actual - expected) / spacing)
    return float(steps.max()) if steps.size else 0.0


def relative_error(actual, expected):
    """``max |actual - expected| / max |expected|`` (inf on NaN or a shape mismatch)."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    if actual.shape != expected.shape or not np.all(np.isfinite(actual)):
        return float("inf")
    scale = np.max(np.abs(expected)) if expected.size else 0.0
    diff = np.max(np.abs(actual - expected)) if expected.size else 0.0
    return float(diff / scale) if scale > 0 else float(diff)


def assert_backends_match(fn, inputs, *, rtol=1e-5, grad=True, seed=0, names=None):
    """Assert that ``fn`` gives the same values and gradients on CUDA and NumPy.

    Inputs are rounded to float32; CUDA runs in float32 with every new device
    array filled with NaN first (so an element a kernel forgets to write shows),
    NumPy runs in float64 as the reference. Outputs and, with ``grad``, the
    gradients of sum(w * fn(x)) for a random w must agree within ``rtol``
    relative to the largest reference magnitude (see :func:`relative_error`).
    A failure names the input by its name in ``names`` where given.
    """
    arrays = [np.asarray(a, dtype=np.float32) for a in inputs]
    results = _run_on_both_backends(fn, arrays, {"numpy": np.float64, "cuda": np.float32},
                                    grad, seed)

    def differ(actual, expected):
        err = relative_error(actual, expected)
        return None if err <= rtol else f"relative error {err:.3g} > {rtol:g}"
    _assert_results_match(results, differ, names, "")


def _run_on_both_backends(fn, arrays, dtypes, grad, seed):
    """{device: (fn's output, [input gradients])} as NumPy arrays, on NumPy and on CUDA.

    The inputs are ``arrays`` as ``dtypes[device]`` (one dtype, or a list of one
    per input); the gradients are those of
    sum(w * fn(x)) for one random w (drawn from ``seed``), given in the
    output's dtype on each device. CUDA's new arrays are filled with NaN first.
    """
    rng = np.random.default_rng(seed)
    results, weight = {}, None
    for device in ("numpy", "cuda"):
        context = _poisoned_allocations() if device == "cuda" else contextlib.nullcontext()
        with context:
            kinds = dtypes[device]
            kinds = kinds if isinstance(kinds, list) else [kinds] * len(arrays)
            tensors = [Tensor(a, device=device, dtype=kind, requires_grad=grad)
                       for a, kind in zip(arrays, kinds)]
            out = fn(*tensors)
            if weight is None:
                weight = rng.standard_normal(out.shape)
            grads = []
            if grad:
                out.backward(Tensor(weight, device=device, dtype=out.dtype))
                grads = [None if t.grad is None else t.grad.numpy() for t in tensors]
            results[device] = (out.numpy(), grads)
    return results


def _assert_results_match(results, differ, names, what):
    """Raise where CUDA's output or a gradient differs from NumPy's: ``differ(actual,
    expected)`` says how (None: they match); ``what`` prefixes the messages."""
    (ref_out, ref_grads), (gpu_out, gpu_grads) = results["numpy"], results["cuda"]
    problem = differ(gpu_out, ref_out)
    if problem:
        raise AssertionError(f"{what}output differs between cuda and numpy: {problem} "
                             f"(shape {ref_out.shape})")
    for i, (g_gpu, g_ref) in enumerate(zip(gpu_grads, ref_grads)):
        if (g_gpu is None) != (g_ref is None):
            raise AssertionError(f"gradient of {_input_label(i, names)}: present on one "
                                 "backend only")
        problem = None if g_ref is None else differ(g_gpu, g_ref)
        if problem:
            raise AssertionError(f"{what}gradient of {_input_label(i, names)} differs between "
                                 f"cuda and numpy: {problem}")


def assert_half_backends_match(fn, inputs, dtype, *, ulps=None, rtol=None, grad=True, seed=0,
                               names=None, float32_inputs=()):
    """Assert that ``fn`` on 16-bit tensors gives the same on CUDA as NumPy's emulation.

    Both backends get the inputs rounded to ``dtype`` (float16 or bfloat16),
    but those at the indices ``float32_inputs`` (parameters) in float32;
    NumPy computes as the kernels do (:func:`gdnflow.precision.emulate`).
    Outputs and, with ``grad``, the gradients of sum(w * fn(x)) for a random
    16-bit w must agree within ``ulps`` units in the last place per element
    (:func:`units_in_last_place`: for elementwise kernels, whose float32
    results may round to either side of a 16-bit boundary) or within
    ``rtol`` relative to the largest reference magnitude (products, whose
    float32 sums run in another order). CUDA's new arrays are NaN-filled.
    """
    if (ulps is None) == (rtol is None):
        raise ValueError("assert_half_backends_match: give exactly one of ulps and rtol")
    dtype = precision.as_dtype(dtype)
    kinds = [precision.FLOAT32 if i in float32_inputs else dtype for i in range(len(inputs))]
    arrays = [np.asarray(a, dtype=np.float32).astype(kind) for a, kind in zip(inputs, kinds)]
    results = _run_on_both_backends(fn, arrays, {"numpy": kinds, "cuda": kinds}, grad, seed)
    if results["cuda"][0].dtype != results["numpy"][0].dtype:
        raise AssertionError(f"output is {results['cuda'][0].dtype} on cuda but "
                             f"{results['numpy'][0].dtype} on numpy")

    def differ(actual, expected):
        if ulps is not None:
            steps = units_in_last_place(actual, expected, expected.dtype)
            return None if steps <= ulps else f"{steps:.3g} units in the last place > {ulps:g}"
        err = relative_error(actual, expected)
        return None if err <= rtol else f"relative error {err:.3g} > {rtol:g}"
    _assert_results_match(results, differ, names, f"{dtype} ")
