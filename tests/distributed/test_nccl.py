"""The NCCL path on one GPU: a communicator of one rank (needs PyCUDA, nccl4py and a GPU)."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import distributed as dist

from distributed_kit import autoencoder

pytestmark = pytest.mark.gpu
pytest.importorskip("nccl.bindings.nccl", reason="nccl4py is not installed (pip install 'gdnflow[nccl]')")


def test_all_reduce_and_broadcast_of_one_rank_keep_the_values():
    values = np.random.default_rng(0).standard_normal((1000, 37)).astype(np.float32)
    for op in ("sum", "mean"):
        t = gf.tensor(values, device="cuda")
        assert dist.all_reduce(t, op) is t
        np.testing.assert_array_equal(t.numpy(), values)
    t = gf.tensor(values, device="cuda")
    dist.broadcast(t, root=0)
    np.testing.assert_array_equal(t.numpy(), values)


def _train(wrap, steps=4, compiled=False):
    """Final parameters of the autoencoder after ``steps`` Adam steps on CUDA."""
    rng = np.random.default_rng(1)
    data = [rng.random((4, 3, 16, 16), dtype=np.float32) for _ in range(steps)]
    model = autoencoder(device="cuda")
    trained = dist.DataParallel(model, bucket_bytes=2048) if wrap else model
    optimizer = gf.optim.Adam(trained.parameters(), lr=1e-2)

    def step_function(batch, step=None):
        loss = ((trained(batch) - batch) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return {"loss": loss}

    if compiled:
        step = gf.compile_step(step_function, data[0])
        for batch in data:
            step(batch)
    else:
        for batch in data:
            step_function(gf.tensor(batch, device="cuda"))
    if wrap:
        assert len(trained.buckets) > 1
        trained.close()
    return {name: p.numpy() for name, p in model.named_parameters()}


@pytest.mark.parametrize("compiled", [False, True])
def test_data_parallel_over_nccl_trains_like_the_model(compiled):
    plain, wrapped = _train(False, compiled=compiled), _train(True, compiled=compiled)
    for name in plain:
        # An average over one rank is the gradient itself (ncclAvg of one value).
        np.testing.assert_allclose(wrapped[name], plain[name], rtol=0, atol=1e-6, err_msg=name)


def test_closing_a_communicator_closes_the_graphs_that_captured_its_collectives_first():
    # NCCL's destroy (and abort) wait until every graph that captured one of the
    # communicator's collectives is destroyed: at exit, a compiled step still holds its graph.
    from gdnflow.backends.cuda.graphs import CudaGraph
    from gdnflow.distributed.nccl import Communicator
    from gdnflow.distributed.transport import SingleProcess
    communicator = Communicator(SingleProcess(), rank=0, size=1, timeout=30)
    values = np.random.default_rng(1).standard_normal(1001).astype(np.float32)
    t = gf.tensor(values, device="cuda")
    graph = CudaGraph()
    graph.capture(lambda: communicator.all_reduce(t.data, "sum", stream=None))
    graph.replay()
    np.testing.assert_array_equal(t.numpy(), values)     # a world of one: the sum is the value
    assert graph.captured
    communicator.close()
    assert not graph.captured
