"""Plan memory (gdnflow.inference.memory): the arena planner, the recording and arena pools."""
import pytest

from gdnflow.inference import PlanError
from gdnflow.inference.memory import ArenaPool, RecordingPool, plan_memory


def check_no_live_overlap(sizes, freed_at, offsets, total):
    n = len(sizes)
    ends = [n if f is None else f for f in freed_at]
    for i in range(n):
        assert offsets[i] % 256 == 0 and offsets[i] + sizes[i] <= total
        for j in range(i + 1, n):
            if j < ends[i]:         # both live when j is allocated
                assert (offsets[i] + sizes[i] <= offsets[j]
                        or offsets[j] + sizes[j] <= offsets[i]), (i, j)


def peak_live_bytes(sizes, freed_at):
    n = len(sizes)
    ends = [n if f is None else f for f in freed_at]
    return max(sum(-(-sizes[i] // 256) * 256 for i in range(t + 1) if ends[i] > t)
               for t in range(n))


@pytest.mark.parametrize("trial", range(20))
def test_allocator_never_gives_overlapping_live_buffers_the_same_bytes(trial, rng):
    n = int(rng.integers(1, 60))
    sizes = [int(s) for s in rng.integers(1, 1 << 20, n)]
    freed_at = [None if rng.random() < 0.1 else int(rng.integers(i + 1, n + 1)) for i in range(n)]
    offsets, total = plan_memory(sizes, freed_at)
    check_no_live_overlap(sizes, freed_at, offsets, total)
    assert peak_live_bytes(sizes, freed_at) <= total <= sum(-(-s // 256) * 256 for s in sizes)


def test_allocator_reuses_buffers_of_a_chain():
    """Layer after layer, each output freed once the next is made: two buffers' worth suffice."""
    sizes = [1000, 4096, 1000, 4096, 1000]
    offsets, total = plan_memory(sizes, [2, 3, 4, 5, None])
    assert total == 4096 + 1024
    check_no_live_overlap(sizes, [2, 3, 4, 5, None], offsets, total)


def test_allocator_rejects_impossible_lifetimes():
    with pytest.raises(ValueError, match="freed at 0"):
        plan_memory([16, 16], [0, None])


class FakePool:
    def __init__(self):
        self.next = 1 << 20

    def allocate(self, nbytes):
        self.next += nbytes
        return self.next


def test_recording_pool_notes_when_python_frees_each_block():
    recorder = RecordingPool(FakePool())
    a = recorder.allocate(100)
    b = recorder.allocate(200)
    del a
    c = recorder.allocate(300)
    del b, c
    assert recorder.sizes == [100, 200, 300]
    assert recorder.freed_at == [2, 3, 3]


def test_arena_pool_hands_out_the_plan_and_refuses_another_sequence():
    pool = ArenaPool(4096, [0, 512], [100, 200])
    assert int(pool.allocate(100)) == 4096 and int(pool.allocate(200)) == 4608
    with pytest.raises(PlanError, match="allocation #2 asks for 8 bytes"):
        pool.allocate(8)
    with pytest.raises(PlanError, match="allocation #0 asks for 99 bytes but the recording "
                                        "run made 100"):
        ArenaPool(0, [0], [100]).allocate(99)
