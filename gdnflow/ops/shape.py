"""Shape operators: reshape and flatten. No kernels: on both backends a
reshape of a contiguous array is a view."""
import math

from gdnflow.autograd import Operator
from gdnflow.errors import ShapeError
from gdnflow.registry import register


@register("reshape")
class Reshape(Operator):
    """The same elements in ``shape`` (one entry may be -1: inferred)."""

    def __init__(self, shape):
        self.shape = tuple(int(s) for s in shape)

    def check(self, x):
        shape, unknown = list(self.shape), [i for i, s in enumerate(self.shape) if s == -1]
        known = math.prod(s for s in shape if s != -1)
        if len(unknown) > 1 or any(s < -1 for s in shape):
            raise ShapeError(f"reshape: bad target shape {self.shape} (at most one -1, no other negatives)")
        if unknown and known and x.size % known == 0:
            shape[unknown[0]] = x.size // known
        if math.prod(shape) != x.size or (unknown and not known):
            raise ShapeError(f"reshape: cannot reshape {x.shape} ({x.size} elements) "
                             f"to {self.shape}")
        self.shape = tuple(shape)

    def forward_numpy(self, x):
        return x.reshape(self.shape)

    forward_cuda = forward_numpy

    def backward(self, gy):
        return (Reshape(self.input_shapes[0])(gy),)


def flatten(x, start_dim=1):
    """Merge dimensions ``start_dim`` and after into one: (N, C, H, W) -> (N, C*H*W)."""
    if not -x.ndim <= start_dim < max(x.ndim, 1):
        raise ShapeError(f"flatten: start_dim {start_dim} out of range for shape {x.shape}")
    start_dim %= max(x.ndim, 1)
    return Reshape(x.shape[:start_dim] + (-1,))(x)
