"""Learned soft-thresholding for gdnflow: ``y = sign(x) * max(|x| - theta_c, 0)``.

A gdnflow operator plugin. Importing this package registers the operator
``softshrink`` (NumPy and CUDA forward and backward, kernels in
``softshrink.cu``); the entry point ``gdnflow.operators: softshrink`` lets
``gdnflow plugins`` and ``gdnflow.registry.get("softshrink")`` find it.

    from gdnflow_softshrink import SoftShrink, soft_shrink
"""
from gdnflow_softshrink.operator import SoftShrinkOp, soft_shrink
from gdnflow_softshrink.layer import SoftShrink

__all__ = ["SoftShrink", "SoftShrinkOp", "soft_shrink"]
__version__ = "0.1.0"
