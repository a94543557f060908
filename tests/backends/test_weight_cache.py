"""The cache of weight-derived arrays (gdnflow/backends/cuda/weight_cache.py), on the CPU:
what it keys on, what guards a hit, and how frozen() blocks nest."""
import types

from gdnflow.backends.cuda.weight_cache import WeightCache


def _weight(ptr, shape=(4, 3, 3, 3)):
    """A stand-in for a device weight: an address, a shape and an allocation object."""
    return types.SimpleNamespace(ptr=ptr, shape=shape, allocation=object())


class _Counter:
    """``make`` for WeightCache.derived: returns a new value per call, and counts them."""

    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return ("derived", self.calls)


def test_nothing_is_kept_outside_a_frozen_block():
    cache, make, w = WeightCache(), _Counter(), _weight(4096)
    assert cache.derived("kind", w, make) != cache.derived("kind", w, make)
    assert make.calls == 2 and cache.entries is None


def test_one_value_per_kind_and_weight_inside_a_block():
    cache, make, w = WeightCache(), _Counter(), _weight(4096)
    with cache.frozen():
        first = cache.derived("a", w, make)
        assert cache.derived("a", w, make) is first
        assert cache.derived("b", w, make) is not first                  # another kind
        assert cache.derived("a", _weight(8192), make) is not first      # another address
        assert cache.derived("a", _weight(4096, (2, 6, 3, 3)), make) is not first
        assert make.calls == 4
    assert cache.entries is None


def test_a_new_allocation_at_the_same_address_is_a_miss():
    cache, make = WeightCache(), _Counter()
    with cache.frozen():
        first = cache.derived("a", _weight(4096), make)
        again = cache.derived("a", _weight(4096), make)     # freed and handed out again
    assert again is not first and make.calls == 2


def test_nested_blocks_share_and_a_callers_cache_replaces_the_enclosing_one():
    cache, make, w = WeightCache(), _Counter(), _weight(4096)
    kept = {}
    with cache.frozen():
        enclosing = cache.entries
        with cache.frozen():                                # nested: the same entries
            assert cache.entries is enclosing
            first = cache.derived("a", w, make)
        with cache.frozen(kept):                            # the caller's: a fresh start
            assert cache.entries is kept
            assert cache.derived("a", w, make) is not first
        assert cache.entries is enclosing and len(enclosing) == 1
    assert cache.entries is None and len(kept) == 1
    with cache.frozen(kept):                                # kept across blocks
        cache.derived("a", w, make)
    assert make.calls == 2
