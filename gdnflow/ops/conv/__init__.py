"""2-D convolution, NCHW: the conv2d and conv_transpose2d operators and their algorithms.

Shapes, formula and output size: :mod:`gdnflow.ops.conv.geometry`. Three
linear maps make up the operator and its gradients; every algorithm, on both
backends, provides all three for a :class:`ConvGeometry`:

=============================   ====================================
``forward(g, x, w)``            x -> y
``backward_data(g, gy, w)``     gy -> gx, the adjoint of forward in x
``backward_weight(g, x, gy)``   (x, gy) -> gw
=============================   ====================================

``conv_transpose2d`` (:mod:`~gdnflow.ops.conv.transpose`) is the same three
maps in another order. The modules:

===============    ==============================================================
``geometry``       parameters, shapes, output size, their checks
``operator``       :class:`Conv2dOp` and :func:`conv2d`
``transpose``      :class:`ConvTranspose2dOp` and :func:`conv_transpose2d`
``epilogue``       act(y + bias + residual) after a convolution, and its gradients
``reference``      :class:`NumpyConv`, the NumPy maps
``row_phases``     the NumPy products of large layers on row-flattened stride phases
``planning``       :class:`ConvPlanner`: which GPU algorithm runs each (geometry, stage)
``algorithms/``    the GPU algorithms: im2col + SGEMM and one GEMM per image for 1x1
                   (``im2col``), the direct 1x1 kernel (``pointwise``, its tiling in
                   ``pointwise_tiles``), the direct depthwise kernels (``depthwise``),
                   Winograd F(4x4, 3x3) / F(2x2, 3x3) (``winograd``), and strided
                   convolutions as stride-1 ones on the sub-pixel grid (``subpixel``)
===============    ==============================================================
"""
from gdnflow.ops.conv.algorithms.depthwise import Depthwise
from gdnflow.ops.conv.algorithms.im2col import Im2colGemm, Pointwise
from gdnflow.ops.conv.algorithms.pointwise import Im2colDirect, PointwiseDirect
from gdnflow.ops.conv.algorithms.subpixel import Subpixel
from gdnflow.ops.conv.algorithms.winograd import WinogradF2, WinogradF4
from gdnflow.ops.conv.epilogue import epilogue_cuda, epilogue_numpy
from gdnflow.ops.conv.geometry import (ACTIVATIONS, STAGES, ConvGeometry, conv_geometry,
                                       conv_parameters, conv_transpose_geometry,
                                       normalize_padding)
from gdnflow.ops.conv.operator import Conv2dOp, conv2d
from gdnflow.ops.conv.planning import ConvPlanner, conv_algorithm, current_planner, planner
from gdnflow.ops.conv.reference import NumpyConv
from gdnflow.ops.conv.transpose import ConvTranspose2dOp, conv_transpose2d

__all__ = ["conv2d", "conv_transpose2d", "Conv2dOp", "ConvTranspose2dOp", "ConvGeometry",
           "conv_geometry", "conv_transpose_geometry", "conv_parameters", "normalize_padding",
           "ACTIVATIONS", "STAGES", "ConvPlanner", "planner", "current_planner",
           "conv_algorithm", "NumpyConv", "epilogue_numpy", "epilogue_cuda", "Im2colGemm",
           "Pointwise", "Im2colDirect", "PointwiseDirect", "Depthwise", "WinogradF4",
           "WinogradF2", "Subpixel"]
