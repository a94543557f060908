"""Checks for operator authors (built-in and plugin alike).

:func:`gradcheck` compares an operator's backward with central finite
differences in float64 on the NumPy backend. :func:`assert_backends_match`
runs one function on the CUDA backend (float32) and on NumPy (float64, as the
reference) from the same random inputs and compares outputs and gradients.
Both take ``fn(*tensors) -> Tensor`` and a list of NumPy input arrays.
"""
import contextlib

import numpy as np

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
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    dropped = 13                                    # float32's 23 mantissa bits - TF32's 10
    half = np.uint32(1 << (dropped - 1)) - np.uint32(1) + ((bits >> dropped) & np.uint32(1))
    finite = (bits & np.uint32(0x7F800000)) != np.uint32(0x7F800000)
    rounded = np.where(finite, (bits + half) & ~np.uint32((1 << dropped) - 1), bits)
    return rounded.view(np.float32)


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
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(a, dtype=np.float32) for a in inputs]
    results = {}
    weight = None
    for device, dtype in (("numpy", np.float64), ("cuda", np.float32)):
        context = _poisoned_allocations() if device == "cuda" else contextlib.nullcontext()
        with context:
            tensors = [Tensor(a, device=device, dtype=dtype, requires_grad=grad) for a in arrays]
            out = fn(*tensors)
            if weight is None:
                weight = rng.standard_normal(out.shape)
            grads = []
            if grad:
                out.backward(Tensor(weight, device=device, dtype=dtype))
                grads = [None if t.grad is None else t.grad.numpy() for t in tensors]
            results[device] = (out.numpy(), grads)
    (ref_out, ref_grads), (gpu_out, gpu_grads) = results["numpy"], results["cuda"]
    err = relative_error(gpu_out, ref_out)
    if not err <= rtol:
        raise AssertionError(f"output differs between cuda and numpy: relative error {err:.3g} "
                             f"> {rtol:g} (shape {ref_out.shape})")
    for i, (g_gpu, g_ref) in enumerate(zip(gpu_grads, ref_grads)):
        if (g_gpu is None) != (g_ref is None):
            raise AssertionError(f"gradient of {_input_label(i, names)}: present on one "
                                 "backend only")
        if g_ref is not None:
            err = relative_error(g_gpu, g_ref)
            if not err <= rtol:
                raise AssertionError(f"gradient of {_input_label(i, names)} differs between cuda "
                                     f"and numpy: relative error {err:.3g} > {rtol:g}")
