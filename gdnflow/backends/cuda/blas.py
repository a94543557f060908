"""Every cuBLAS call gdnflow makes, in one module.

Through ``skcuda.cublas`` (the only part of scikit-cuda that works under
NumPy 2). Its handle is created once per process, bound to the runtime's
stream and given a workspace of its own. Its math mode follows
``gdnflow.config.settings.matmul_precision``, read at every call: the
default math mode for "fp32" (results match the NumPy reference to 1e-4),
TF32 tensor-core math for "tf32".
scikit-cuda has no strided-batched GEMM, no math-mode setter and no
workspace setter; their prototypes are declared here from cublas_api.h on the
library scikit-cuda loaded.

Products of 16-bit matrices (float16, bfloat16: :mod:`gdnflow.precision`) go
to ``cublasGemmEx`` / ``cublasGemmStridedBatchedEx`` with float32 accumulation
(CUBLAS_COMPUTE_32F) on the tensor cores, through nvmath-python's cuBLAS
bindings (scikit-cuda has no GemmEx); they get a handle of their own, on the
same stream, with its own workspace.

The helpers take row-major (C-order) matrices, as gdnflow stores them, and
translate to cuBLAS's column-major convention: a row-major C = A·B is the
column-major C^T = B^T·A^T, so A and B swap places and nothing is transposed
in memory.
"""
import ctypes
import functools
import importlib
import importlib.util
import sys
import types

import numpy as np
import pycuda.driver as drv

from gdnflow.backends.cuda.runtime import get_runtime
from gdnflow.config import check_matmul_precision, settings
from gdnflow.precision import BFLOAT16, FLOAT16, FLOAT32

#: cuBLAS math modes (cublas_api.h) of the values of settings.matmul_precision.
MATH_MODES = {"fp32": 0, "tf32": 3}     # CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH
#: The workspace every cuBLAS call of gdnflow uses (NVIDIA's recommended size
#: on Hopper). User-owned so that cuBLAS never allocates one itself: it would
#: do so inside a CUDA graph capture (gdnflow.backends.cuda.graphs).
WORKSPACE_BYTES = 32 << 20
_OP = {False: 0, True: 1}       # CUBLAS_OP_N, CUBLAS_OP_T
#: cudaDataType (library_types.h) of the 16-bit operands of GemmEx.
CUDA_DATA_TYPES = {FLOAT16: 2, BFLOAT16: 14}     # CUDA_R_16F, CUDA_R_16BF
CUDA_R_32F = 0                  # a float32 C of 16-bit A and B
COMPUTE_32F = 68                # CUBLAS_COMPUTE_32F: float32 accumulation
GEMM_DEFAULT = -1               # CUBLAS_GEMM_DEFAULT: cuBLAS's heuristic picks the kernel
#: CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION: split-K partial sums of a
#: 16-bit product stay float32 (by default cuBLAS may keep them in the output type).
FLOAT32_REDUCTIONS = 16


def _import_skcuda_cublas():
    """``skcuda.cublas`` without running scikit-cuda's package ``__init__``.

    That ``__init__`` only declares a namespace through ``pkg_resources``,
    whose import took 0.2 s of a fresh process's first output on the H200
    host (a third of a warm codec start); an empty package module with the
    same ``__path__`` lets ``skcuda.cublas`` and its relative imports load.
    """
    if "skcuda" not in sys.modules:
        spec = importlib.util.find_spec("skcuda")
        if spec is None:
            raise ImportError("scikit-cuda is not installed (pip install 'gdnflow[cuda]')")
        package = types.ModuleType("skcuda")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["skcuda"] = package
    return importlib.import_module("skcuda.cublas")


cublas = _import_skcuda_cublas()

_lib = cublas._libcublas
_lib.cublasSetMathMode.restype = int
_lib.cublasSetMathMode.argtypes = [ctypes.c_void_p, ctypes.c_int]
_lib.cublasSgemmStridedBatched.restype = int
_lib.cublasSgemmStridedBatched.argtypes = [
    ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong,
    ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong,
    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_int]
_lib.cublasSetWorkspace_v2.restype = int
_lib.cublasSetWorkspace_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
_workspace = None               # the DeviceAllocation behind the handle's workspace
_math_mode = None               # the handle's math mode, set when the knob changes


@functools.lru_cache(maxsize=None)
def _create_handle():
    global _workspace
    h = cublas.cublasCreate()
    cublas.cublasSetStream(h, get_runtime().stream.handle)
    # After cublasSetStream, which resets the workspace to cuBLAS's own pool.
    _workspace = drv.mem_alloc(WORKSPACE_BYTES)
    cublas.cublasCheckStatus(_lib.cublasSetWorkspace_v2(h, int(_workspace), WORKSPACE_BYTES))
    return h


def handle():
    """The process's cuBLAS handle: on gdnflow's stream, own workspace, and the math mode
    of ``settings.matmul_precision`` (set again only when the knob changed)."""
    global _math_mode
    h = _create_handle()
    mode = MATH_MODES.get(settings.matmul_precision)
    if mode != _math_mode:
        if mode is None:
            check_matmul_precision(settings.matmul_precision)
        cublas.cublasCheckStatus(_lib.cublasSetMathMode(h, mode))
        _math_mode = mode
    return h


@functools.lru_cache(maxsize=None)
def _half_handle():
    """(nvmath's cublas bindings, a handle, its workspace) for the 16-bit products."""
    try:
        # local import: nvmath-python (the cuda extra) is needed by 16-bit products only
        from nvmath.bindings import cublas as nvmath_cublas
    except ImportError as exc:
        raise ImportError(f"16-bit (bfloat16, float16) matrix products need nvmath-python "
                          f"(pip install 'gdnflow[cuda]'): {exc}") from exc
    h = nvmath_cublas.create()
    nvmath_cublas.set_stream(h, get_runtime().stream.handle)
    workspace = drv.mem_alloc(WORKSPACE_BYTES)
    nvmath_cublas.set_workspace(h, int(workspace), WORKSPACE_BYTES)
    nvmath_cublas.set_math_mode(h, FLOAT32_REDUCTIONS)
    return nvmath_cublas, h, workspace


def matmul(a, b, c, m, n, k, trans_a=False, trans_b=False, alpha=1.0, beta=0.0,
           batch=1, stride_a=0, stride_b=0, stride_c=0, dtype=FLOAT32, out_dtype=None):
    """C = alpha * op(A) @ op(B) + beta * C for row-major matrices of ``dtype``.

    ``a``, ``b``, ``c`` are device pointers. op(A) is m x k (A is stored k x m
    when ``trans_a``), op(B) is k x n (B stored n x k when ``trans_b``), C is
    m x n. With ``batch`` > 1 the matrices repeat every ``stride_*`` elements
    (a stride of 0 reuses one matrix for the whole batch). ``dtype`` float32
    (SGEMM, in ``settings.matmul_precision``), float64 (DGEMM, one product: the codec's
    exact hyper-synthesis, whose integer sums IEEE float64 computes exactly in any order)
    or a 16-bit float (GemmEx, float32 accumulation, C rounded once to ``out_dtype``:
    ``dtype`` by default, or float32 to keep the sums unrounded).
    """
    lda = m if trans_a else k
    ldb = k if trans_b else n
    if dtype == np.float64:
        # Native FP64 (cuBLAS's FP64 emulation is opt-in and never asked for here): the
        # exact hyper-synthesis needs its integer sums computed exactly.
        if batch != 1:
            raise ValueError(f"matmul: float64 products are single (batch 1), got batch {batch}")
        cublas.cublasDgemm(handle(), "t" if trans_b else "n", "t" if trans_a else "n",
                           n, m, k, alpha, b, ldb, a, lda, beta, c, n)
        return
    if dtype != FLOAT32:
        out_type = CUDA_DATA_TYPES.get(out_dtype if out_dtype is not None else dtype, CUDA_R_32F)
        _matmul_16bit(a, b, c, m, n, k, trans_a, trans_b, alpha, beta, batch,
                      stride_a, stride_b, stride_c, lda, ldb, CUDA_DATA_TYPES[dtype], out_type)
        return
    alpha_ = ctypes.c_float(alpha)
    beta_ = ctypes.c_float(beta)
    if batch == 1:
        cublas.cublasSgemm(handle(), "t" if trans_b else "n", "t" if trans_a else "n",
                           n, m, k, alpha, b, ldb, a, lda, beta, c, n)
        return
    status = _lib.cublasSgemmStridedBatched(
        handle(), _OP[trans_b], _OP[trans_a], n, m, k, ctypes.byref(alpha_),
        b, ldb, stride_b, a, lda, stride_a, ctypes.byref(beta_), c, n, stride_c, batch)
    cublas.cublasCheckStatus(status)


def _matmul_16bit(a, b, c, m, n, k, trans_a, trans_b, alpha, beta, batch,
                  stride_a, stride_b, stride_c, lda, ldb, data_type, out_type):
    """:func:`matmul` of 16-bit matrices (row-major, swapped into cuBLAS's column-major)."""
    nvmath_cublas, h, _ = _half_handle()
    scalars = np.array([alpha, beta], np.float32)   # host pointers, read during the call
    alpha_, beta_ = scalars.ctypes.data, scalars.ctypes.data + 4
    if batch == 1:
        nvmath_cublas.gemm_ex(h, _OP[trans_b], _OP[trans_a], n, m, k, alpha_, b, data_type, ldb,
                              a, data_type, lda, beta_, c, out_type, n, COMPUTE_32F, GEMM_DEFAULT)
    else:
        nvmath_cublas.gemm_strided_batched_ex(
            h, _OP[trans_b], _OP[trans_a], n, m, k, alpha_, b, data_type, ldb, stride_b,
            a, data_type, lda, stride_a, beta_, c, out_type, n, stride_c, batch, COMPUTE_32F,
            GEMM_DEFAULT)
