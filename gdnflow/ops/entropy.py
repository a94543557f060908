"""Operators of entropy models and noisy-quantisation training.
CUDA kernels: ``cuda_src/entropy.cu``.

``softplus tanh abs``
    elementwise maps with their usual derivatives (|x| takes 0 at 0).
``round``
    round half to even, with the *identity* as gradient (straight-through):
    the only useful gradient of a quantiser inside a training graph.
``uniform_noise``
    y = x + u, u ~ U(-1/2, 1/2) from a counter-based generator (Philox4x32-10)
    keyed by a 64-bit ``key`` and a 64-bit ``stream``: element i gets the
    first word of Philox(counter = (i, 0, stream_lo, stream_hi), key). The
    noise is a pure function of (key, stream, i), drawn on the device (no
    host-to-device copy) and reproduced bit for bit by the NumPy backend;
    a trainer passing ``stream = step`` gets, after a resume, exactly the
    noise of the uninterrupted run. A data-parallel process holding samples
    s, s + 1, ... of the whole batch sets ``settings.noise_sample_offset =
    s``: its elements count from s x (elements per sample), so the processes
    together draw exactly the one-process batch's noise. The gradient is the
    identity.
``sigmoid_difference``
    y = |sigmoid(s u) - sigmoid(s l)|, s = -1 where l + u > 0 else +1: the
    probability mass of a logistic-CDF density between logits l and u,
    evaluated in the distribution's tail so that tiny masses keep float32
    precision (tensorflow-compression's "sign trick").
"""
import numpy as np

from gdnflow.autograd import Operator
from gdnflow.backends import cuda
from gdnflow.config import settings
from gdnflow.errors import ShapeError
from gdnflow.ops.elementwise import UnaryOp
from gdnflow.registry import register
from gdnflow import step_state
from gdnflow.step_context import StepCounter
from gdnflow.step_state import StepSyncError

SOURCE = "entropy.cu"


class EntropyUnaryOp(UnaryOp):
    """A parameterless elementwise operator whose kernels live in entropy.cu."""

    autocast = "float32"    # entropy.cu's kernels are float32 only

    def forward_cuda(self, x):
        y = cuda.empty(x.shape, x.dtype)
        if x.size:
            cuda.kernel(SOURCE, self.forward_kernel, "PPi").launch(x.size, x.ptr, y.ptr, x.size)
        self._save(x, y)
        return y

    def backward_cuda(self, gy):
        # Any valid pointer stands in for what the operator did not save:
        # the kernel does not read it.
        x, y = (a if a is not None else gy for a in (self.saved.x, self.saved.y))
        gx = cuda.empty(gy.shape, gy.dtype)
        if gy.size:
            cuda.kernel(SOURCE, self.backward_kernel, "PPPPi").launch(
                gy.size, x.ptr, y.ptr, gy.ptr, gx.ptr, gy.size)
        return gx


@register("softplus")
class SoftplusOp(EntropyUnaryOp):
    """y = log(1 + e^x); dy/dx = sigmoid(x). Above x = 20 the CUDA kernel returns x."""
    kernel = "softplus"
    def f(self, x): return np.logaddexp(x.dtype.type(0), x)
    def df(self, x, y, gy): return gy / (1 + np.exp(-x))


@register("tanh")
class TanhOp(EntropyUnaryOp):
    """y = tanh(x); dy/dx = 1 - y^2."""
    kernel, saves = "tanh", ("y",)
    def f(self, x): return np.tanh(x)
    def df(self, x, y, gy): return gy * (1 - y * y)


@register("abs")
class AbsOp(EntropyUnaryOp):
    """y = |x|; dy/dx = sign(x), taken as 0 at x = 0."""
    kernel = "abs"
    def f(self, x): return np.abs(x)
    def df(self, x, y, gy): return gy * np.sign(x)


@register("round")
class RoundOp(Operator):
    """y = x rounded to the nearest integer, halves to even (numpy.rint, torch.round).

    The gradient is the identity (straight-through estimator), not the true
    derivative 0: in a graph, rounding stands for quantisation that a
    training signal has to pass through.
    """

    def forward_numpy(self, x):
        return np.rint(x)

    def forward_cuda(self, x):
        y = cuda.empty(x.shape, x.dtype)
        if x.size:
            cuda.kernel(SOURCE, "round_forward", "PPi").launch(x.size, x.ptr, y.ptr, x.size)
        return y

    def backward(self, grad_output):
        return (grad_output,)


# ----------------------------------------------------------- Philox noise --
PHILOX_M = (np.uint64(0xD2511F53), np.uint64(0xCD9E8D57))
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
_MASK32 = np.uint64(0xFFFFFFFF)


def _split64(value, what):
    value = int(value)
    if not 0 <= value < 2 ** 64:
        raise ValueError(f"uniform_noise: {what} must be an integer in [0, 2^64), got {value}")
    return value & 0xFFFFFFFF, value >> 32


def philox4x32(counter, key):
    """Philox4x32-10 of 128-bit counters under a 64-bit key, in NumPy.

    ``counter`` is a sequence of four uint32 arrays (or numbers) that
    broadcast together, ``key`` a pair of 32-bit integers; returns the four
    output words as uint32 arrays. The NumPy twin of ``philox_word0`` in
    entropy.cu (which keeps only the first word).
    """
    c0, c1, c2, c3 = np.broadcast_arrays(*[np.asarray(c, dtype=np.uint64) for c in counter])
    k0, k1 = (int(k) & 0xFFFFFFFF for k in key)
    m0, m1 = PHILOX_M
    for _ in range(10):
        p0, p1 = m0 * c0, m1 * c2            # exact: both factors are below 2^32
        hi0, lo0 = p0 >> np.uint64(32), p0 & _MASK32
        hi1, lo1 = p1 >> np.uint64(32), p1 & _MASK32
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint64(k0), lo1, hi0 ^ c3 ^ np.uint64(k1), lo0
        k0, k1 = (k0 + PHILOX_W[0]) & 0xFFFFFFFF, (k1 + PHILOX_W[1]) & 0xFFFFFFFF
    return tuple(c.astype(np.uint32) for c in (c0, c1, c2, c3))


def philox4x32_word0(counter0, key, stream):
    """First Philox4x32-10 word for counters (counter0, 0, stream_lo, stream_hi) under ``key``.

    ``counter0``: uint32 values, one per element; ``key``, ``stream``:
    integers in [0, 2^64). This is the random word of element counter0 in
    :class:`UniformNoise`.
    """
    s_lo, s_hi = _split64(stream, "stream")
    return philox4x32((counter0, 0, s_lo, s_hi), _split64(key, "key"))[0]


def noise_offset(shape):
    """The first noise counter of a tensor of ``shape``: ``settings.noise_sample_offset``
    samples (the leading axis) of its size; ValueError past the counter's 2^32."""
    n = int(np.prod(shape, dtype=np.int64))
    if n >= 2 ** 31:
        raise ValueError(f"uniform_noise: {n} elements exceed the 2^31 - 1 the kernel indexes")
    offset = int(settings.noise_sample_offset) * (n // shape[0]) if n else 0
    if offset + n > 2 ** 32:
        raise ValueError(f"uniform_noise: a batch slice starting at sample "
                         f"{settings.noise_sample_offset} of {n // shape[0]} elements each "
                         "passes the noise counter's 2^32 elements")
    return offset


def uniform_noise_values(shape, key, stream, dtype=np.float32):
    """The noise ``uniform_noise`` adds to a tensor of ``shape``: values in [-1/2, 1/2).

    Its elements count from :func:`noise_offset` (0 unless a data-parallel
    process set ``settings.noise_sample_offset``).
    """
    n = int(np.prod(shape, dtype=np.int64))
    offset = noise_offset(shape)
    words = philox4x32_word0(np.arange(offset, offset + n, dtype=np.uint64), key, stream)
    # 24 random bits: every value is exact in float32, so both backends agree bit for bit.
    u = (words >> np.uint32(8)).astype(np.float64) * 2.0 ** -24 - 0.5
    return u.astype(dtype).reshape(shape)


@register("uniform_noise")
class UniformNoiseOp(Operator):
    """y = x + u with u ~ U(-1/2, 1/2) drawn from (``key``, ``stream``); gradient: identity.

    See the module docstring for the generator. ``key`` is an integer in
    [0, 2^64); ``stream`` too, or a :class:`~gdnflow.step_context.StepCounter`
    (a compiled step's ``step.index``), whose number the CUDA kernel reads
    from device memory when it runs, so that a captured step draws new noise
    on every replay.
    """

    def __init__(self, key, stream=0):
        self.key_words = _split64(key, "key")
        self.key = int(key)
        self.counter = stream if isinstance(stream, StepCounter) else None
        if self.counter is None:
            if step_state.active() is not None:
                # A number would be frozen into the captured graph: every replay, same noise.
                raise StepSyncError(
                    f"uniform_noise inside a compiled step function got the stream {stream!r}, "
                    "a number fixed when the step is captured: pass the step's counter "
                    "(noise_stream=step.index) so that each step draws new noise")
            self.stream_words = _split64(stream, "stream")

    @property
    def stream(self):
        """The stream's number (a counter's current value)."""
        if self.counter is not None:
            return self.counter.value
        return self.stream_words[0] | self.stream_words[1] << 32

    def forward_numpy(self, x):
        return x + uniform_noise_values(x.shape, self.key, self.stream, x.dtype)

    def forward_cuda(self, x):
        y = cuda.empty(x.shape, x.dtype)
        if x.size:
            offset = noise_offset(x.shape)
            if self.counter is not None:
                cuda.kernel(SOURCE, "uniform_noise_forward_counted", "PPiIIIP").launch(
                    x.size, x.ptr, y.ptr, x.size, offset, *self.key_words,
                    self.counter.device_words().ptr)
            else:
                cuda.kernel(SOURCE, "uniform_noise_forward", "PPiIIIII").launch(
                    x.size, x.ptr, y.ptr, x.size, offset, *self.key_words, *self.stream_words)
        return y

    def backward(self, grad_output):
        return (grad_output,)


@register("sigmoid_difference")
class SigmoidDifferenceOp(Operator):
    """y = |sigmoid(s u) - sigmoid(s l)| for logits l (``lower``) and u (``upper``) of one shape.

    s = -1 where l + u > 0, else +1 (see the module docstring). Gradients,
    with a = sigmoid(s u), b = sigmoid(s l), d = a - b and sgn = sign(d)
    (taken as s where d = 0)::

        gu = gy sgn s a (1 - a)        gl = -gy sgn s b (1 - b)
    """

    def check(self, lower, upper):
        if lower.shape != upper.shape:
            raise ShapeError(f"{self.label}: lower and upper must have one shape, got "
                             f"{lower.shape} and {upper.shape}")

    def forward_numpy(self, lower, upper):
        self.save(lower=lower, upper=upper)
        s = np.where(lower + upper > 0, -1, 1).astype(lower.dtype)
        return np.abs(_logistic(s * upper) - _logistic(s * lower))

    def forward_cuda(self, lower, upper):
        y = cuda.empty(lower.shape, lower.dtype)
        if y.size:
            cuda.kernel(SOURCE, "sigmoid_difference_forward", "PPPi").launch(
                y.size, lower.ptr, upper.ptr, y.ptr, y.size)
        self.save(lower=lower, upper=upper)
        return y

    def backward(self, grad_output):
        return tuple(self.wrap(g) for g in self.dispatch("backward", grad_output.data))

    def backward_numpy(self, gy):
        lower, upper = self.saved.lower, self.saved.upper
        s = np.where(lower + upper > 0, -1, 1).astype(gy.dtype)
        a, b = _logistic(s * upper), _logistic(s * lower)
        d = a - b
        g = gy * np.where(d != 0, np.sign(d), s) * s
        return -g * b * (1 - b), g * a * (1 - a)

    def backward_cuda(self, gy):
        lower, upper = self.saved.lower, self.saved.upper
        g_lower, g_upper = cuda.empty(gy.shape, gy.dtype), cuda.empty(gy.shape, gy.dtype)
        if gy.size:
            cuda.kernel(SOURCE, "sigmoid_difference_backward", "PPPPPi").launch(
                gy.size, lower.ptr, upper.ptr, gy.ptr, g_lower.ptr, g_upper.ptr, gy.size)
        return g_lower, g_upper


def _logistic(v):
    # exp(-v) overflows to inf for v < -709 (float64) or -88 (float32): 1/inf = 0, the limit.
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-v))


# ------------------------------------------------------------- functions --
def softplus(x):
    """log(1 + e^x), elementwise."""
    return SoftplusOp()(x)


def tanh(x):
    """Hyperbolic tangent, elementwise."""
    return TanhOp()(x)


def abs(x):  # noqa: A001 (mirrors numpy.abs)
    """``|x|``, elementwise (gradient sign(x), 0 at 0)."""
    return AbsOp()(x)


def round(x):  # noqa: A001 (mirrors numpy.round)
    """x rounded half to even, with the identity as gradient (straight-through)."""
    return RoundOp()(x)


def uniform_noise(x, key, stream=0):
    """x + U(-1/2, 1/2) noise that is a function of (key, stream) only; gradient: identity.

    ``stream``: an integer, or a compiled step's counter (see :class:`UniformNoiseOp`)."""
    return UniformNoiseOp(key, stream)(x)


def sigmoid_difference(lower, upper):
    """``|sigmoid(upper) - sigmoid(lower)|``, computed in the logistic's tail (see the module doc)."""
    return SigmoidDifferenceOp()(lower, upper)
