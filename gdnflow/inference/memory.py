"""Device memory of a plan: allocations recorded with their lifetimes, then placed in one arena.

A plan runs its program once under a :class:`RecordingPool` (given to
``Runtime.allocating_from``), which notes each allocation's size and when
Python freed it; :func:`plan_memory` places the buffers at offsets of one
arena so that buffers alive at the same time never share bytes; the capture
runs under an :class:`ArenaPool`, which hands out those offsets in the
recorded order. Pure Python: the pools wrap whatever allocator they are given.
"""
import contextlib
import gc

from gdnflow.inference.errors import PlanError

#: Arena offsets are multiples of this (cudaMalloc's own alignment; cuBLAS
#: and the vectorised kernels need at least 16 bytes).
ALIGNMENT = 256


def plan_memory(sizes, freed_at, alignment=ALIGNMENT):
    """Offsets in one arena for buffers with known lifetimes: (offsets, arena bytes).

    Buffer i is allocated i-th and freed when ``freed_at[i]`` allocations had
    been made (None: never, i.e. after the last), so it is live during
    [i, freed_at[i]) in allocation order, and two buffers conflict when those
    intervals overlap. Greedy by size: the largest buffers are placed first,
    each at the lowest aligned offset where it overlaps no conflicting buffer
    already placed (first fit). Non-conflicting buffers may share bytes: on
    one stream, everything that used a freed buffer was enqueued before
    anything that uses its successor.
    """
    n = len(sizes)
    ends = [n if f is None else int(f) for f in freed_at]
    for i, end in enumerate(ends):
        if end <= i:
            raise ValueError(f"plan_memory: buffer {i} is freed at {end}, before it exists")
    padded = [max(alignment, -(-int(s) // alignment) * alignment) for s in sizes]
    offsets, placed = [0] * n, []
    for i in sorted(range(n), key=lambda k: (-padded[k], k)):
        busy = sorted((offsets[j], offsets[j] + padded[j]) for j in placed
                      if j < ends[i] and i < ends[j])
        offset = 0
        for start, end in busy:
            if offset + padded[i] <= start:
                break
            offset = max(offset, end)
        offsets[i] = offset
        placed.append(i)
    total = max((offsets[i] + padded[i] for i in range(n)), default=0)
    return offsets, total


class _RecordedBlock:
    """A pool allocation that tells the recorder when Python frees it."""

    __slots__ = ("recorder", "index", "block")

    def __init__(self, recorder, index, block):
        self.recorder, self.index, self.block = recorder, index, block

    def __int__(self):
        return int(self.block)

    def __del__(self):
        self.recorder.freed_at[self.index] = len(self.recorder.sizes)


class RecordingPool:
    """Stands in for the runtime's pool: allocates from it and records sizes and lifetimes.

    ``sizes[i]`` is the i-th allocation's byte count; ``freed_at[i]`` how many
    allocations had been made when Python freed it (None while it lives): the
    input of :func:`plan_memory`.
    """

    def __init__(self, pool):
        self.pool = pool
        self.sizes, self.freed_at = [], []

    def allocate(self, nbytes):
        index = len(self.sizes)
        self.sizes.append(int(nbytes))
        self.freed_at.append(None)
        return _RecordedBlock(self, index, self.pool.allocate(nbytes))


class _ArenaBlock:
    """An address inside the plan's arena; keeps the arena alive while an array uses it."""

    __slots__ = ("arena", "ptr")

    def __init__(self, arena, ptr):
        self.arena, self.ptr = arena, ptr

    def __int__(self):
        return self.ptr


class ArenaPool:
    """Stands in for the runtime's pool during capture: the recorded allocations, in order.

    The i-th ``allocate(nbytes)`` returns the address ``int(arena) + offsets[i]``;
    a size other than ``sizes[i]``, or more allocations than recorded, raises
    :class:`~gdnflow.inference.errors.PlanError` naming ``owner`` (what is
    being captured). ``count``: how many were handed out.
    """

    def __init__(self, arena, offsets, sizes, owner="inference plan: the forward"):
        self.arena, self.base = arena, int(arena)
        self.offsets, self.sizes = offsets, sizes
        self.owner = owner
        self.count = 0

    def allocate(self, nbytes):
        i = self.count
        if i >= len(self.sizes) or int(nbytes) != self.sizes[i]:
            recorded = f"{self.sizes[i]} bytes" if i < len(self.sizes) else "nothing"
            owner, _, what = self.owner.partition(": ")
            raise PlanError(f"{owner}: allocation #{i} asks for {int(nbytes)} bytes but "
                            f"the recording run made {recorded} there; {what or 'the code'} does "
                            "not allocate the same way twice (a cache filled on first use?)")
        self.count += 1
        return _ArenaBlock(self.arena, self.base + self.offsets[i])


@contextlib.contextmanager
def gc_paused():
    """No cyclic garbage collection within the block.

    During capture a collected device allocation that is not pooled would be
    freed with cuMemFree, which CUDA refuses while a capture runs.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
