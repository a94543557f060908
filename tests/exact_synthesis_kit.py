"""What the tests of ``cuda_src/exact_synthesis.cu`` share: the host shims of its
hyper-synthesis kernels (each loops over the elements a kernel's threads would take) and
a simulated device whose float64 GEMM is NumPy's."""
import ctypes

import numpy as np

from host_kernels import ShimDevice

SHAPE_ARGS = ", ".join(f"int s{k}" for k in range(12))
SHAPE = "ExactLayerShape s{" + ", ".join(f"s{k}" for k in range(12)) + "};"
HOST_SHIM = f"""
extern "C" void host_exact_hidden_layer(const double* a, const double* weight,
                                        const double* bias, double* out, {SHAPE_ARGS},
                                        int transpose, int relu, int exponent, double limit) {{
    {SHAPE}
    for (int i = 0; i < s.out_channels * s.out_height * s.out_width; ++i)
        out[i] = exact_hidden_element(i, a, weight, bias, s, transpose, relu, exponent, limit);
}}
extern "C" void host_exact_last_layer(const double* a, const double* weight, const double* bias,
                                      unsigned char* indexes, const double* table,
                                      int table_count, {SHAPE_ARGS}, int transpose, int relu,
                                      int shift) {{
    {SHAPE}
    for (int i = 0; i < s.out_channels * s.out_height * s.out_width; ++i)
        indexes[i] = exact_last_element(i, a, weight, bias, table, table_count, s, transpose,
                                        relu, shift);
}}
extern "C" void host_exact_columns(const double* a, {SHAPE_ARGS}, double* columns) {{
    {SHAPE}
    const int n = s.in_channels * s.kernel_height * s.kernel_width * s.out_height * s.out_width;
    for (int i = 0; i < n; ++i) columns[i] = exact_column_value(i, a, s);
}}
extern "C" void host_exact_hidden_from_products(const double* products, const double* bias,
                                                double* out, {SHAPE_ARGS}, int transpose,
                                                int relu, int exponent, double limit) {{
    {SHAPE}
    for (int j = 0; j < exact_phase_threads(s); ++j)
        exact_hidden_thread(j, products, bias, out, s, transpose, relu, exponent, limit);
}}
extern "C" void host_exact_last_from_products(const double* products, const double* bias,
                                              unsigned char* indexes, const double* table,
                                              int table_count, {SHAPE_ARGS}, int transpose,
                                              int relu, int shift) {{
    {SHAPE}
    for (int j = 0; j < exact_phase_threads(s); ++j)
        exact_last_thread(j, products, bias, indexes, table, table_count, s, transpose, relu,
                          shift);
}}
"""


class GemmShimDevice(ShimDevice):
    """The kernels built for the host, and cuBLAS's float64 GEMM as NumPy's (``matmul`` on
    the shim's memory, row-major as gdnflow.backends.cuda.matmul): exact as well on the
    hyper-synthesis's integers."""

    def matmul(self, a, b, c, m, n, k, trans_a=False, dtype=np.float32, **options):
        assert np.dtype(dtype) == np.float64 and not options, (dtype, options)

        def view(pointer, count):
            return np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_double)),
                                         (count,))
        left = view(a, m * k).reshape((k, m) if trans_a else (m, k))
        view(c, m * n)[:] = ((left.T if trans_a else left) @ view(b, k * n).reshape(k, n)).ravel()
        self.launched.append("matmul")
