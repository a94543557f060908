"""Arrays computed from a weight alone, kept while the caller promises the weight does not change.

Winograd's transformed filters and the sub-pixel rewrite's rearranged weights
are recomputed on every call by default: gdnflow's weights are updated in
place by the optimizers, so a cache keyed on a weight's address could return
a stale result after an optimizer step. Inside :meth:`WeightCache.frozen`
(inference) each one is computed once per weight and reused until the block
ends. Pure Python: no PyCUDA, so it works on a simulated device too.
"""
import contextlib


class WeightCache:
    """The arrays derived from weights while a :meth:`frozen` block is open.

    An entry is keyed on (kind, the weight's address, its shape) and holds a
    reference to the weight's allocation, so the address cannot be handed to
    another array while the entry exists; a hit must come from that very
    allocation. Outside every block nothing is cached.
    """

    def __init__(self):
        #: {key: (allocation, derived array)} inside a frozen() block, None outside.
        self.entries = None

    @contextlib.contextmanager
    def frozen(self, cache=None):
        """Within this block, compute each derived array once per weight and reuse it.

        For inference: the caller promises that no weight changes inside the
        block (no optimizer step, no load_state_dict). Everything cached is
        dropped when the outermost block ends, unless ``cache`` (a dict of the
        caller's) is given: the entries then go there, live as long as the
        caller keeps it, and replace any enclosing block's entries until this
        block ends (an inference plan keeps the arrays its CUDA graph reads
        this way). A nested block without ``cache`` shares the enclosing one's.
        """
        enclosing = self.entries
        if cache is not None:
            self.entries = cache
        elif self.entries is None:
            self.entries = {}
        try:
            yield
        finally:
            self.entries = enclosing

    def derived(self, kind, w, make):
        """``make()``, an array computed from the weight ``w`` alone: once per weight inside
        :meth:`frozen` (keyed on ``kind`` and w's address and shape, guarded by w's
        allocation), on every call outside it."""
        entries = self.entries
        if entries is None:
            return make()
        key = (kind, w.ptr, w.shape)
        hit = entries.get(key)
        if hit is not None and hit[0] is w.allocation:
            return hit[1]
        value = make()
        entries[key] = (w.allocation, value)
        return value


#: The process's cache of weight-derived arrays (one device per process).
weight_cache = WeightCache()


def frozen_weights(cache=None):
    """``with frozen_weights(cache=None):`` :meth:`WeightCache.frozen` of :data:`weight_cache`."""
    return weight_cache.frozen(cache)
