"""Which algorithm runs each stage of a convolution on the GPU: :class:`ConvPlanner`.

The planner in effect is ``settings.conv_planner`` (:mod:`gdnflow.config`)
if that is set, else :data:`planner`, the process's own. An algorithm is a
class with ``name``, ``supports(g)``, the three maps of
:data:`~gdnflow.ops.conv.geometry.STAGES` and ``fuses_bias_activation``
(its forward takes ``bias`` and ``activation``); optionally ``stages`` (the
maps it offers the planner, default all three), ``preferred(g)`` (whether
the heuristic takes it for a geometry it supports, default yes),
``fuses_residual`` (its forward also takes ``residual``),
``backward_data_fuses_bias`` (its backward_data takes ``bias``, for
conv_transpose2d) and ``binds_planner`` (its maps run other algorithms: they
run on an instance made with the planner, see :func:`bound`).
"""
import os

import numpy as np

from gdnflow.backends import cuda
from gdnflow.config import settings
from gdnflow.ops.conv.algorithms.depthwise import Depthwise
from gdnflow.ops.conv.algorithms.grouped import GroupedDirect
from gdnflow.ops.conv.algorithms.im2col import Im2colGemm, Pointwise
from gdnflow.ops.conv.algorithms.implicit_gemm import ImplicitGemm
from gdnflow.ops.conv.algorithms.pointwise import Im2colDirect, PointwiseDirect
from gdnflow.ops.conv.algorithms.subpixel import Subpixel
from gdnflow.ops.conv.algorithms.winograd import WinogradF2, WinogradF4
from gdnflow.ops.conv.geometry import STAGES
from gdnflow.ops.conv.reference import NumpyConv
from gdnflow.ops.cast import cast_array
from gdnflow.precision import FLOAT32, is_half


class ConvPlanner:
    """Chooses the CUDA algorithm for each (geometry, stage): the one place that does.

    ``stage`` is ``"forward"``, ``"backward_data"`` or ``"backward_weight"``.
    By default the choice is a heuristic: the first algorithm of
    :meth:`candidates` that supports the geometry and stage and is
    ``preferred`` for it, in the order depthwise (direct kernel), grouped
    direct kernel (forward of groups of few channels, and of first layers on
    image channels with a small output), pointwise
    direct kernel (memory-bound 1x1 layers), pointwise (GEMM, no lowering),
    Winograd F(4x4) (wide 3x3 stride-1 layers; F(2x2) is
    never preferred), the sub-pixel rewrite (strided layers whose stride-1
    form would run F(4x4)), im2col + the direct kernel's product
    (memory-bound products, groups 1, forward only), im2col + GEMM. With
    ``autotune`` on (or ``GDNFLOW_CONV_AUTOTUNE=1``) every algorithm
    supporting the geometry and stage is timed once on random data with CUDA
    events and the fastest is kept. Either way the answer is cached per
    (geometry, stage), so it is decided once per shape; autotune before
    capturing a CUDA graph (timing allocates).
    """

    def __init__(self, autotune=None):
        if autotune is None:
            autotune = os.environ.get("GDNFLOW_CONV_AUTOTUNE", "") not in ("", "0")
        self.autotune = autotune
        self.cache = {}
        #: (geometry, stage) -> {algorithm name: milliseconds}, for what was measured.
        self.timings = {}

    @staticmethod
    def candidates():
        """Every algorithm class, in the heuristic's order of preference."""
        return (Depthwise, GroupedDirect, PointwiseDirect, Pointwise, WinogradF4, WinogradF2,
                Subpixel, Im2colDirect, Im2colGemm)

    @staticmethod
    def supported(g, stage):
        """The candidates that can run ``stage`` of ``g``, in order of preference."""
        return [a for a in ConvPlanner.candidates()
                if stage in getattr(a, "stages", STAGES) and a.supports(g)]

    def choose(self, g, stage):
        """The algorithm class to run ``stage`` of geometry ``g`` with."""
        key = (g, stage)
        algorithm = self.cache.get(key)
        if algorithm is None:
            supported = self.supported(g, stage)
            algorithm = next(a for a in supported
                             if getattr(a, "preferred", None) is None or a.preferred(g))
            if self.autotune and len(supported) > 1:
                algorithm = self.measure(g, stage, supported)
            self.cache[key] = algorithm
        return algorithm

    def measure(self, g, stage, algorithms, repeats=5):
        """Time ``stage`` of ``g`` with each algorithm; return the fastest."""
        import pycuda.driver as drv    # local import: PyCUDA on first use
        runtime = cuda.get_runtime()
        rng = np.random.default_rng(0)
        x = runtime.from_numpy(rng.standard_normal(g.x_shape, dtype=np.float32))
        w = runtime.from_numpy(rng.standard_normal(g.w_shape, dtype=np.float32))
        gy = runtime.from_numpy(rng.standard_normal(g.y_shape, dtype=np.float32))
        args = {"forward": (x, w), "backward_data": (gy, w), "backward_weight": (x, gy)}[stage]
        start, end = drv.Event(), drv.Event()
        times = {}
        for algorithm in algorithms:
            run = getattr(bound(algorithm, self), stage)
            run(g, *args)                       # compile and warm up
            start.record(runtime.stream)
            for _ in range(repeats):
                run(g, *args)
            end.record(runtime.stream)
            end.synchronize()
            times[algorithm.name] = end.time_since(start) / repeats
        self.timings[(g, stage)] = times
        return min(algorithms, key=lambda a: times[a.name])


def bound(algorithm, chooser):
    """``algorithm`` ready to run for ``chooser`` (a planner): an instance made with it where
    the class ``binds_planner`` (its maps ask the planner for other algorithms), else the
    class itself."""
    return algorithm(chooser) if getattr(algorithm, "binds_planner", False) else algorithm


#: The process's planner, in effect unless ``settings.conv_planner`` is set;
#: ``planner.autotune = True`` to measure instead of guess.
planner = ConvPlanner()


def current_planner():
    """The planner in effect: ``settings.conv_planner`` if set, else :data:`planner`."""
    chosen = settings.conv_planner
    return planner if chosen is None else chosen


def conv_algorithm(device, g, stage):
    """The object whose ``forward``/``backward_data``/``backward_weight`` runs ``stage``:
    the NumPy reference on the CPU, else the choice of the planner in effect."""
    if device == "numpy":
        return NumpyConv
    chooser = current_planner()
    return bound(chooser.choose(g, stage), chooser)


#: Groups a 16-bit convolution runs as GEMMs up to: past it the per-group products
#: are tiny (the depthwise backward: one channel a group), so such layers compute
#: in float32 and round once.
MAX_HALF_GROUPS = 4


def half_conv_algorithm(g, stage, tensor_cores=None):
    """The algorithm that runs ``stage`` of ``g`` on 16-bit tensors on the GPU, or None.

    The depthwise kernel's forward for the depthwise layers it supports; the
    grouped direct kernel's for those it prefers in 16 bits (first layers on image
    channels, groups of few channels); the tensor-core implicit GEMM for the forward
    of the layers it prefers (where ``tensor_cores``, default
    ``settings.half_conv_tensor_cores``, allows); the
    1x1 GEMM where it applies; the sub-pixel rewrite for the backward_data of a
    strided layer whose kernel is wider than its stride (its stride-1 convolution
    chosen here too: :class:`HalfPlanner`);
    else im2col + GEMM, for layers of at most :data:`MAX_HALF_GROUPS` groups.
    None tells the operator to compute the stage in float32 and round its
    result (depthwise backward, for now).
    """
    if stage in Depthwise.half_precision_stages and Depthwise.supports(g):
        return Depthwise
    if (stage in GroupedDirect.half_precision_stages and GroupedDirect.supports(g)
            and GroupedDirect.half_preferred(g)):
        return GroupedDirect
    if tensor_cores is None:
        tensor_cores = settings.half_conv_tensor_cores
    if (tensor_cores and stage in ImplicitGemm.half_precision_stages
            and ImplicitGemm.supports(g) and ImplicitGemm.preferred(g)):
        return ImplicitGemm
    if g.groups > MAX_HALF_GROUPS:
        return None
    algorithm = next(a for a in (Pointwise, Subpixel, Im2colGemm)
                     if stage in a.half_precision_stages and a.supports(g)
                     and (a is not Subpixel or Subpixel.half_preferred(g)))
    return bound(algorithm, HalfPlanner)


class HalfPlanner:
    """The chooser a 16-bit :class:`Subpixel` asks for its stride-1 convolution."""

    @staticmethod
    def choose(g, stage):
        """:func:`half_conv_algorithm` of ``g`` and ``stage`` without the implicit GEMM:
        it would take the inner convolution of a codec's 5x5 / 2 data gradient, but that
        path is neither tested nor measured with it yet."""
        return half_conv_algorithm(g, stage, tensor_cores=False)


def stage_algorithm(device, g, stage, dtype):
    """What runs ``stage`` of ``g`` on ``dtype`` tensors on ``device``; None for a 16-bit
    stage that has no 16-bit algorithm there (always on NumPy, the emulation): the operator
    then computes it in float32 and rounds the result once (:func:`run_stage`)."""
    if not is_half(dtype):
        return conv_algorithm(device, g, stage)
    return None if device == "numpy" else half_conv_algorithm(g, stage)


def run_stage(device, g, stage, *arrays, run=None):
    """``stage`` (``"forward"``, ``"backward_data"``, ``"backward_weight"``) of ``g`` on
    ``arrays``, in the first one's dtype: ``run(algorithm, *arrays)`` (default: the
    algorithm's map of that name) with the algorithm :func:`stage_algorithm` picks; a
    16-bit stage without a 16-bit algorithm runs in float32 on widened arrays and its
    result is rounded once."""
    if run is None:
        def run(algorithm, *operands):
            return getattr(algorithm, stage)(g, *operands)
    dtype = arrays[0].dtype
    algorithm = stage_algorithm(device, g, stage, dtype)
    if algorithm is not None:
        return run(algorithm, *arrays)
    wide = [cast_array(a, FLOAT32) for a in arrays]
    return cast_array(run(conv_algorithm(device, g, stage), *wide), dtype)
