"""Magnitude pruning: requested sparsity, masks through optimiser steps, CUDA masks."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import nn, ops, optim
from gdnflow.sparse import apply_masks, prunable_layers, prune, sparsity_report
from gdnflow.sparse.prune import MASK, add_mask_slots


def _model(rng, device="numpy"):
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, rng=rng), nn.ReLU(),
                         nn.Conv2d(8, 16, 3, padding=1, rng=rng), nn.ReLU(),
                         nn.DepthwiseConv2d(16, 3, padding=1, rng=rng),
                         nn.Conv2d(16, 5, 1, rng=rng)).to(device)


def test_global_pruning_hits_the_requested_sparsity(rng):
    model = _model(rng)
    report = prune(model, 0.8)
    assert set(report) == {"0", "2", "5"}            # the depthwise conv is left dense
    zeros = sum(z for z, _, _ in sparsity_report(model).values())
    total = sum(n for _, n, _ in sparsity_report(model).values())
    assert zeros == round(0.8 * total)
    assert np.count_nonzero(model[4].weight.numpy()) == model[4].weight.size
    assert MASK not in model[4]._buffers
    for _, m in prunable_layers(model):
        np.testing.assert_array_equal(m.weight.numpy() != 0, m.weight_mask.numpy() != 0)


def test_global_threshold_orders_magnitudes(rng):
    model = _model(rng)
    before = {name: np.abs(m.weight.numpy()).copy() for name, m in prunable_layers(model)}
    prune(model, 0.6)
    kept, dropped = [], []
    for name, m in prunable_layers(model):
        mask = m.weight_mask.numpy() != 0
        kept.append(before[name][mask])
        dropped.append(before[name][~mask])
    assert np.concatenate(dropped).max() <= np.concatenate(kept).min()


@pytest.mark.parametrize("sparsity", [0.5, 0.9, 0.98])
def test_per_layer_pruning_hits_the_sparsity_in_each_layer(sparsity, rng):
    model = _model(rng)
    report = prune(model, sparsity, per_layer=True)
    for name, (zeros, total, masked) in sparsity_report(model).items():
        assert masked and zeros == round(sparsity * total)
        assert report[name] == pytest.approx(zeros / total)


def test_pruning_further_keeps_earlier_zeros(rng):
    model = _model(rng)
    prune(model, 0.5)
    first = {n: m.weight_mask.numpy().copy() for n, m in prunable_layers(model)}
    prune(model, 0.9)
    for name, m in prunable_layers(model):
        assert np.all(m.weight_mask.numpy()[first[name] == 0] == 0)


def test_bad_sparsity_and_nothing_to_prune(rng):
    with pytest.raises(ValueError, match=r"in \[0, 1\)"):
        prune(_model(rng), 1.0)
    with pytest.raises(ValueError, match="no Conv2d"):
        prune(nn.Sequential(nn.ReLU()), 0.5)


def _sgd_steps_keep_zeros(device, rng):
    model = _model(rng, device)
    prune(model, 0.85, per_layer=True)
    masks = {n: m.weight_mask.numpy().copy() for n, m in prunable_layers(model)}
    weights = {n: m.weight.numpy().copy() for n, m in prunable_layers(model)}
    optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    for _ in range(3):
        x = gf.tensor(rng.standard_normal((2, 3, 7, 6)), device=device)
        loss = ops.sum(ops.mul(model(x), model(x)))
        model.zero_grad()
        loss.backward()
        optimizer.step()
        apply_masks(model)
    for name, m in prunable_layers(model):
        w = m.weight.numpy()
        assert np.all(w[masks[name] == 0] == 0), name
        assert not np.allclose(w[masks[name] != 0], weights[name][masks[name] != 0]), name
        np.testing.assert_array_equal(m.weight_mask.numpy(), masks[name])


def test_masks_keep_pruned_weights_at_zero_through_sgd_steps(rng):
    _sgd_steps_keep_zeros("numpy", rng)


@pytest.mark.gpu
def test_masks_keep_pruned_weights_at_zero_through_sgd_steps_cuda(rng):
    _sgd_steps_keep_zeros("cuda", rng)


def test_mask_slots_for_loading(rng):
    model = _model(rng)
    add_mask_slots(model, ["0", "5"])
    assert np.all(model[0].weight_mask.numpy() == 1) and MASK not in model[2]._buffers
    with pytest.raises(KeyError, match="no layer 'missing'"):
        add_mask_slots(model, ["missing"])


def test_repruning_never_unprunes(rng):
    model = _model(rng)
    prune(model, 0.9)
    first = {n: m.weight_mask.numpy().copy() for n, m in prunable_layers(model)}
    prune(model, 0.5, per_layer=True)            # a lower sparsity: nothing grows back
    for name, m in prunable_layers(model):
        np.testing.assert_array_equal(m.weight_mask.numpy(), first[name])
