"""Generalized divisive normalization (GDN, inverse GDN, simplified forms).

- :mod:`gdnflow.ops.gdn.operator`: :class:`GDNOp` (registered as
  ``"gdn"``): the formula, gamma's layout, the backward, what is cached; the
  NumPy path and the dispatch to the GPU path. ``gdnflow.ops.gdn(...)`` is
  the function that applies it.
- :mod:`gdnflow.ops.gdn.cuda_plan`: the GPU path, one prepared
  :class:`CudaPlan` per variant and input shape, and the chunking of pixels.
- :mod:`gdnflow.ops.gdn.parametrize`: the non-negative reparameterisation of
  the GDN layer's stored beta and gamma.

``docs/gdn.md`` has the derivation, the design and the measurements.
"""
from gdnflow.ops.gdn.cuda_plan import CudaPlan
from gdnflow.ops.gdn.operator import VARIANTS, GDNOp, gdn
from gdnflow.ops.gdn.parametrize import (PEDESTAL, NonNegativeParametrizeOp,
                                         NonNegativeReparametrization)

__all__ = ["gdn", "GDNOp", "VARIANTS", "CudaPlan", "NonNegativeParametrizeOp",
           "NonNegativeReparametrization", "PEDESTAL"]
