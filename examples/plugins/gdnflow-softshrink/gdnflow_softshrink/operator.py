"""The ``softshrink`` operator: learned soft-thresholding, per channel.

    y = sign(x) * max(|x| - theta_c, 0)

x is (N, C, ...) with the channel on axis 1 (NCHW for images), theta is (C,).
Gradients, where a_i = [|x_i| > theta_c] (the element passes the threshold):

    dL/dx_i     = a_i * dL/dy_i
    dL/dtheta_c = -sum over the elements i of channel c of a_i * sign(x_i) * dL/dy_i

sign(0) is taken as +1 (``copysign``) on both backends, so they agree even
where a negative threshold lets x = 0 through. CUDA kernels: ``softshrink.cu``.
"""
import math

import numpy as np

from gdnflow import plugins

SOURCE = plugins.source_file(__file__, "softshrink.cu")
BACKWARD_BLOCK = 256     # threads per channel in the backward (a multiple of 32)


@plugins.register("softshrink")
class SoftShrinkOp(plugins.Operator):
    """y = sign(x) * max(|x| - theta_c, 0) for x of shape (N, C, ...) and theta of shape (C,)."""

    #: Nodes of this custom ONNX domain and type import as this operator
    #: (inputs x, theta; no attributes): see gdnflow.io.onnx.custom_operator.
    onnx_op = ("org.gdnflow.examples", "SoftShrink")

    def example_inputs(self, rng):
        """Inputs for gradcheck and ``gdnflow plugin-check``: thresholds in a useful range."""
        return {"x": rng.standard_normal((2, 3, 4, 5)), "theta": rng.uniform(0.1, 0.8, 3)}

    def check(self, x, theta):
        if x.ndim < 2 or theta.shape != (x.shape[1],):
            raise plugins.ShapeError(f"softshrink: x must be (N, C, ...) and theta (C,), got x "
                                     f"{x.shape} and theta {theta.shape}")
        if x.size >= 2 ** 31:
            raise ValueError(f"softshrink: {x.size} elements exceed the kernels' 32-bit index")

    def forward_numpy(self, x, theta):
        t = theta.reshape((1, -1) + (1,) * (x.ndim - 2))
        self.save(x=x, theta=theta)
        return np.copysign(np.maximum(np.abs(x) - t, 0), x)

    def forward_cuda(self, x, theta):
        y = plugins.empty(x.shape, x.dtype)
        inner = math.prod(x.shape[2:])
        plugins.kernel(SOURCE, "softshrink_forward", "PPPiii").launch(
            x.size, x.ptr, theta.ptr, y.ptr, x.size, x.shape[1], inner)
        self.save(x=x, theta=theta)
        return y

    def backward(self, grad_output):
        gx, gtheta = self.dispatch("backward", grad_output.data)
        return (self.wrap(gx) if self.needs_grad[0] else None,
                self.wrap(gtheta) if self.needs_grad[1] else None)

    def backward_numpy(self, gy):
        x, theta = self.saved.x, self.saved.theta
        active = np.abs(x) > theta.reshape((1, -1) + (1,) * (x.ndim - 2))
        gx = np.where(active, gy, 0)
        other_axes = (0,) + tuple(range(2, x.ndim))
        gtheta = -np.sum(np.where(active, gy * np.copysign(1, x), 0), axis=other_axes)
        return gx, gtheta.astype(gy.dtype)

    def backward_cuda(self, gy):
        x, theta = self.saved.x, self.saved.theta
        gx = plugins.empty(x.shape, x.dtype)
        gtheta = plugins.empty(theta.shape, theta.dtype)
        # One block per channel (see softshrink.cu); the channel's sum stays in it.
        plugins.kernel(SOURCE, "softshrink_backward", "PPPPPiii")(
            (x.shape[1], 1, 1), (BACKWARD_BLOCK, 1, 1), x.ptr, theta.ptr, gy.ptr, gx.ptr,
            gtheta.ptr, x.shape[0], x.shape[1], math.prod(x.shape[2:]))
        return gx, gtheta


def soft_shrink(x, theta):
    """sign(x) * max(|x| - theta_c, 0): x is (N, C, ...), theta is (C,); both tensors."""
    return SoftShrinkOp()(x, theta)
