"""DataParallel: one model per rank, gradients averaged in buckets while backward runs.

The trainable parameters are cut, in reverse registration order (about the
order in which backward completes their gradients), into buckets of about
``bucket_bytes``. Each bucket owns one flat buffer. During a backward, the
gradient-ready hook of :mod:`gdnflow.autograd` counts each bucket's complete
gradients; when a bucket is complete, it is started (every bucket before it
first, so all ranks start the same buckets in the same order, as MPI and
NCCL require):

- on CUDA: an event on gdnflow's stream, which a separate communication
  stream waits for; on that stream the gradients are copied into the flat
  buffer and all-reduced by NCCL (average); an event marks the end. The rest
  of the backward runs meanwhile on gdnflow's stream;
- on NumPy: the gradients are copied into the buffer and MPI's non-blocking
  all-reduce (sum) is started.

When the backward ends (the backward-end hook), :meth:`DataParallel.finish`
starts what is left (buckets holding a parameter that got no gradient: a zero
gradient stands in for it) and completes every bucket: on CUDA gdnflow's
stream waits for the communication stream, then copies the averages back
into the gradient arrays (no host wait; see :mod:`.cuda_bucket` for why not
earlier); on NumPy
the sums are waited for and scaled by 1 / world size. So ``loss.backward()``
returns with averaged gradients and the optimiser needs no change.
Gradients are reduced in float32 (the parameters' dtype).
"""
import contextlib
import weakref

from gdnflow import autograd
from gdnflow.distributed import world as _world
from gdnflow.distributed.buckets import HostBucket
from gdnflow.distributed.collectives import broadcast, check_same

#: Default bytes of gradients per bucket.
BUCKET_BYTES = 4 << 20


class DataParallel:
    """Wrap ``module`` for data-parallel training over the world's ranks.

    At construction: checks that every rank has the same parameter names and
    shapes (a DistributedError naming the ranks otherwise), then broadcasts
    parameters and buffers from rank 0. ``ddp(x)`` is ``module(x)``; every
    backward through the module averages its gradients over the ranks (see
    the module docstring); :meth:`finish` is called by the backward's end and
    may be called again (it then does nothing). ``ddp.module`` is the model;
    other attributes (``parameters()``, ``state_dict()``, ``train()``...) are
    the module's. Inside ``with ddp.no_sync():`` backwards only accumulate
    local gradients (gradient accumulation: the next backward outside
    reduces the sum).
    """

    def __init__(self, module, bucket_bytes=BUCKET_BYTES):
        if int(bucket_bytes) < 1:
            raise ValueError(f"DataParallel: bucket_bytes must be >= 1, got {bucket_bytes!r}")
        self.module = module
        self.bucket_bytes = int(bucket_bytes)
        self.world = _world.current()
        self._sync = True
        self._buckets = []
        self._handles = []
        self._params = ()
        named = list(module.named_parameters())
        # requires_grad too: it decides the buckets, which every rank must cut alike.
        check_same("model parameters (names and shapes)",
                   [(name, tuple(p.shape), str(p.dtype), p.device, p.requires_grad)
                    for name, p in named])
        for _, p in named:
            broadcast(p)
        for _, b in module.named_buffers():
            broadcast(b)
        reference = weakref.ref(self)
        self._handles.append(autograd.on_backward_end(lambda: _call(reference, "_backward_ended")))
        self._build()
        # Dropped without close(): the hooks (which hold the buckets' flat buffers) go too.
        weakref.finalize(self, _remove_hooks, self._handles)

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def __getattr__(self, name):
        if name == "module":            # not yet set: __init__ failed early
            raise AttributeError(name)
        return getattr(self.module, name)

    def __repr__(self):
        return (f"DataParallel({type(self.module).__name__}, {len(self._buckets)} buckets of "
                f"<= {self.bucket_bytes} bytes, rank {self.world.rank} of {self.world.size})")

    @contextlib.contextmanager
    def no_sync(self):
        """Within the block, backwards do not reduce (local gradient accumulation)."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    @property
    def buckets(self):
        """The buckets, in the order they are reduced (each: its parameters and flat buffer)."""
        return list(self._buckets)

    def finish(self):
        """Start the buckets not started yet, then complete every bucket's reduction."""
        if not any(bucket.state for bucket in self._buckets):
            return
        self._start_ready(force=True)
        try:
            for bucket in self._buckets:
                bucket.complete()
        finally:
            for bucket in self._buckets:
                bucket.reset()

    def close(self):
        """Remove the hooks; the module trains alone afterwards."""
        _remove_hooks(self._handles)

    # -------------------------------------------------------------- internals --
    def _build(self):
        """Cut the trainable parameters into buckets and hook their gradients."""
        _remove_hooks(self._handles, keep=1)       # the backward-end hook stays
        params = [p for p in self.module.parameters() if p.requires_grad]
        self._params = tuple(id(p) for p in self.module.parameters())
        groups, current, size = [], [], 0
        for p in reversed(params):
            nbytes = p.size * p.dtype.itemsize
            if current and (size + nbytes > self.bucket_bytes or p.dtype != current[0].dtype
                            or p.device != current[0].device):
                groups.append(current)
                current, size = [], 0
            current.append(p)
            size += nbytes
        if current:
            groups.append(current)
        self._buckets = [_bucket_class(group[0].device)(group, index, self.world)
                         for index, group in enumerate(groups)]
        reference = weakref.ref(self)
        for bucket in self._buckets:
            for p in bucket.params:
                self._handles.append(autograd.on_gradient_ready(
                    p, lambda p, bucket=bucket: _call(reference, "_gradient_ready", bucket)))

    def _gradient_ready(self, bucket):
        if not self._sync:
            return
        bucket.ready += 1
        bucket.state = "waiting"
        if bucket.ready == len(bucket.params):
            bucket.state = "ready"
            self._start_ready(force=False)

    def _start_ready(self, force):
        """Start buckets in order while they are ready (``force``: all of them)."""
        for bucket in self._buckets:
            if bucket.state == "started":
                continue
            if bucket.state != "ready" and not force:
                return
            # A parameter the backward gave no gradient (not reached, or reached only
            # through an operator that returns None for it) still takes part.
            bucket.fill_missing_gradients()
            bucket.start()
            bucket.state = "started"

    def _backward_ended(self):
        if not self._sync:
            return
        if tuple(id(p) for p in self.module.parameters()) != self._params:
            # Parameters were replaced (load_state_dict): hook the new ones and
            # reduce every bucket of this backward's gradients now.
            self._build()
            if any(p.grad is not None for bucket in self._buckets for p in bucket.params):
                for bucket in self._buckets:
                    bucket.state = "waiting"
        self.finish()


def _call(reference, method, *args):
    """Call ``method`` of the DataParallel behind the weak ``reference``, if it still exists."""
    ddp = reference()
    if ddp is not None:
        getattr(ddp, method)(*args)


def _remove_hooks(handles, keep=0):
    """Remove the hooks of ``handles`` after the first ``keep``, in place (the list stays)."""
    for handle in handles[keep:]:
        handle.remove()
    del handles[keep:]


def _bucket_class(device):
    """The bucket class for ``device``; the CUDA one's module imports PyCUDA, so only then."""
    if device != "cuda":
        return HostBucket
    from gdnflow.distributed import cuda_bucket  # local import: PyCUDA and NCCL on first use
    return cuda_bucket.CudaBucket
