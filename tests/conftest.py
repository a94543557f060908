"""Shared test setup: the ``gpu`` marker skips where no CUDA device is usable."""
import zlib

import numpy as np
import pytest

import gdnflow


def pytest_collection_modifyitems(config, items):
    if gdnflow.cuda_available():
        return
    from gdnflow.backends import cuda
    skip = pytest.mark.skip(reason=f"no usable CUDA device: {cuda.unavailable_reason()}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng(request):
    """A random generator seeded from the test's name: fresh inputs per test, reproducible."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
