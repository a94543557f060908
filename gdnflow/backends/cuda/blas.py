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

import pycuda.driver as drv

from gdnflow.backends.cuda.runtime import get_runtime
from gdnflow.config import check_matmul_precision, settings

#: cuBLAS math modes (cublas_api.h) of the values of settings.matmul_precision.
MATH_MODES = {"fp32": 0, "tf32": 3}     # CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH
#: The workspace every cuBLAS call of gdnflow uses (NVIDIA's recommended size
#: on Hopper). User-owned so that cuBLAS never allocates one itself: it would
#: do so inside a CUDA graph capture (gdnflow.backends.cuda.graphs).
WORKSPACE_BYTES = 32 << 20
_OP = {False: 0, True: 1}       # CUBLAS_OP_N, CUBLAS_OP_T


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


def matmul(a, b, c, m, n, k, trans_a=False, trans_b=False, alpha=1.0, beta=0.0,
           batch=1, stride_a=0, stride_b=0, stride_c=0):
    """C = alpha * op(A) @ op(B) + beta * C for row-major float32 matrices.

    ``a``, ``b``, ``c`` are device pointers. op(A) is m x k (A is stored k x m
    when ``trans_a``), op(B) is k x n (B stored n x k when ``trans_b``), C is
    m x n. With ``batch`` > 1 the matrices repeat every ``stride_*`` elements
    (a stride of 0 reuses one matrix for the whole batch).
    """
    lda = m if trans_a else k
    ldb = k if trans_b else n
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
