"""The convolution tests' stand-in for the GPU: kernels built for the host, NumPy as memory.

``simulate(kernel, sm_count=132, matmul=None)`` makes a :class:`HostDevice`
and puts it in the GPU's place (``gdnflow.backends.cuda.simulated``) for the
rest of the test: the algorithms' Python runs as on the GPU, their device
arrays are :class:`host_kernels.HostArray` and their launches go to the
objects ``kernel(file, name, arg_types, defines)`` returns.
"""
import contextlib

import numpy as np
import pytest

from gdnflow.backends import cuda
from host_kernels import HostArray


class HostDevice:
    """A device for :func:`gdnflow.backends.cuda.simulated` (it is its own runtime)."""

    stream = None

    def __init__(self, kernel, sm_count=132, matmul=None):
        self.kernel = kernel
        self.sm_count = sm_count
        if matmul is not None:
            self.matmul = matmul

    def get_runtime(self):
        return self

    def launch_grid(self, threads, block=256, blocks_per_sm=16):
        return (max(1, min(-(-threads // block), self.sm_count * blocks_per_sm)), 1, 1)

    def empty(self, shape, dtype=np.float32):
        return HostArray(shape, dtype=dtype)

    def full(self, shape, value, dtype=np.float32):
        return HostArray(shape, np.full(shape, value, np.float32))


@pytest.fixture
def simulate():
    """A function ``(kernel, sm_count=132, matmul=None) -> HostDevice`` that stands the
    device in for the GPU until the test ends."""
    with contextlib.ExitStack() as stack:
        def start(kernel, sm_count=132, matmul=None):
            return stack.enter_context(cuda.simulated(HostDevice(kernel, sm_count, matmul)))
        yield start
