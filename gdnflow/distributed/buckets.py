"""A DataParallel bucket: parameters whose gradients are reduced together, through one flat buffer.

:class:`HostBucket` is the NumPy one (the transport's non-blocking sum);
:mod:`gdnflow.distributed.cuda_bucket` holds the CUDA one (NCCL on a side stream).
"""
import numpy as np

from gdnflow.backends import get_backend
from gdnflow.distributed import world as _world
from gdnflow.tensor import Tensor


class Bucket:
    """Parameters whose gradients are reduced together, and the flat buffer that carries them.

    ``state``: None (nothing this backward), "waiting" (some gradients
    complete), "ready" (all complete), "started" (reduction under way).
    """

    def __init__(self, params, index, world):
        self.params = params
        self.index = index
        self.world = world
        self.offsets = np.cumsum([0] + [p.size for p in params])
        self.flat = get_backend(params[0].device).full((int(self.offsets[-1]),), 0.0,
                                                       params[0].dtype)
        self.reset()

    @property
    def nbytes(self):
        """Bytes of the flat buffer."""
        return int(self.offsets[-1]) * self.flat.dtype.itemsize

    def reset(self):
        """Forget this backward's progress."""
        self.ready = 0
        self.state = None

    def fill_missing_gradients(self):
        """A zero gradient for each parameter the backward gave none (it still takes part)."""
        for p in self.params:
            if p.grad is None:
                p.grad = Tensor.wrap(get_backend(p.device).full(p.shape, 0.0, p.dtype), p.device)

    def start(self):
        """Begin the reduction of the complete gradients."""
        raise NotImplementedError

    def complete(self):
        """Finish the reduction: the averaged gradients are in place (or queued, on CUDA)."""
        raise NotImplementedError


class HostBucket(Bucket):
    """A bucket of NumPy gradients: copied into the buffer, summed by the transport (MPI)."""

    request = None

    def start(self):
        for p, begin, end in zip(self.params, self.offsets, self.offsets[1:]):
            self.flat[begin:end] = p.grad.data.reshape(-1)
        self.request = _world.transport().start_all_reduce(self.flat)

    def complete(self):
        if self.request is None:
            return
        request, self.request = self.request, None
        request.wait()
        self.flat *= self.flat.dtype.type(1.0 / self.world.size)
        for p, begin, end in zip(self.params, self.offsets, self.offsets[1:]):
            # A new array: a gradient array may be shared (an operator's backward
            # can hand one array to two inputs), so it is not written in place.
            p.grad = Tensor.wrap(self.flat[begin:end].reshape(p.shape).copy(), p.device)
