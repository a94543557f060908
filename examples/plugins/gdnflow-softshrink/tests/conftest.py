"""Tests marked ``gpu`` skip where no CUDA device is usable."""
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
