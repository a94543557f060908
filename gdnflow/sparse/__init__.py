"""Pruned networks: magnitude pruning with masks, CSR filters with input offsets,
the direct sparse convolution (``sparse_conv2d``, both backends), a layer that
picks dense or sparse per shape, and pruned checkpoints::

    from gdnflow import sparse
    sparse.prune(model, 0.9)            # masks as buffers "weight_mask"
    sparse.apply_masks(model)           # after each optimiser step when fine-tuning
    sparse.sparsify(model)              # pruned Conv2d -> SparseConv2d (inference)
    y = sparse.sparse_conv2d(x, sparse.to_csr(w, (Hp, Wp)), stride=1, padding=1)

An optional part: ``import gdnflow`` does not load it (the registry loads it
when asked for "sparse_conv2d" by name). docs/sparse.md lists its modules.
"""
from gdnflow.sparse.csr import CSRWeight, tap_offsets, to_csr
from gdnflow.sparse.conv import sparse_conv2d
from gdnflow.sparse.prune import apply_masks, prunable_layers, prune, sparsity_report
from gdnflow.sparse.layers import SparseConv2d, describe_model, sparsify
from gdnflow.sparse.checkpoint import load_pruned
from gdnflow.sparse.dispatch import describe

__all__ = ["CSRWeight", "to_csr", "tap_offsets", "sparse_conv2d", "prune", "apply_masks",
           "prunable_layers", "sparsity_report", "SparseConv2d", "sparsify", "describe_model",
           "load_pruned", "describe"]
