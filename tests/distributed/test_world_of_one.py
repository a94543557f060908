"""A world of one process: no launcher, no MPI import, DataParallel trains like the bare model."""
import gc
import subprocess
import sys
import weakref

import numpy as np
import pytest

import gdnflow as gf
from gdnflow import autograd
from gdnflow import distributed as dist
from gdnflow.distributed.world import DistributedError, detect_launcher

from distributed_kit import autoencoder


def test_without_a_launcher_init_imports_no_mpi():
    code = ("import sys; from gdnflow import distributed as d; w = d.init(); "
            "assert 'mpi4py' not in sys.modules, 'mpi4py imported'; print(tuple(w))")
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "RANK", "WORLD_SIZE")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert "(0, 1, 0, 'single')" in done.stdout


def test_a_launcher_missing_variables_is_named():
    with pytest.raises(DistributedError, match="MASTER_ADDR, MASTER_PORT are not"):
        detect_launcher({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"})
    assert detect_launcher({"PMI_RANK": "0"}) == "mpi"
    assert detect_launcher({"WORLD_SIZE": "1"}) == "single"


def test_data_parallel_of_one_trains_like_the_model(tmp_path):
    rng = np.random.default_rng(0)
    batches = [gf.tensor(rng.random((2, 3, 16, 16), dtype=np.float32)) for _ in range(3)]
    results = []
    for wrap in (False, True):
        model = autoencoder()
        trained = dist.DataParallel(model, bucket_bytes=512) if wrap else model
        optimizer = gf.optim.Adam(trained.parameters(), lr=1e-2)
        for batch in batches:
            loss = ((trained(batch) - batch) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        results.append({name: p.numpy().copy() for name, p in model.named_parameters()})
        if wrap:
            assert len(trained.buckets) > 1
            trained.close()
    for name in results[0]:
        np.testing.assert_array_equal(results[1][name], results[0][name], err_msg=name)


class _NoGradient(gf.autograd.Operator):
    """y = x, with no gradient for x (as an operator with a non-differentiable input)."""

    def forward_numpy(self, x):
        return x.copy()

    def backward(self, grad_output):
        return (None,)


def test_a_parameter_reached_without_a_gradient_gets_zeros():
    model = autoencoder()
    ddp = dist.DataParallel(model, bucket_bytes=1)      # a bucket per parameter
    weight = model[0].weight
    # The weight's hook fires (its one use is done) though no gradient reached it: its
    # bucket is complete, and is reduced with a zero gradient like the parameters unused.
    _NoGradient()(weight).sum().backward()
    np.testing.assert_array_equal(weight.grad.numpy(), np.zeros(weight.shape, np.float32))
    assert all(p.grad is not None for p in model.parameters())
    ddp.close()


def test_replaced_parameters_are_hooked_and_still_reduced():
    model = autoencoder()
    ddp = dist.DataParallel(model, bucket_bytes=512)
    x = gf.tensor(np.ones((1, 3, 16, 16), np.float32))
    model[0].bias = gf.nn.Parameter(model[0].bias.numpy())     # as a dtype cast would
    for _ in range(2):
        ((ddp(x) - x) ** 2).mean().backward()
        # Every bucket was reduced and finished: none is left waiting or started.
        assert [bucket.state for bucket in ddp.buckets] == [None] * len(ddp.buckets)
    assert any(p is model[0].bias for bucket in ddp.buckets for p in bucket.params)
    ddp.close()


def test_a_dropped_data_parallel_removes_its_hooks():
    model = autoencoder()
    ddp = dist.DataParallel(model, bucket_bytes=512)
    buckets = weakref.ref(ddp.buckets[0])
    del ddp
    gc.collect()
    assert buckets() is None                # the hooks held the buckets' buffers
    assert not any(id(p) in autograd._gradient_hooks for p in model.parameters())
