"""autograd's gradient-ready and backward-end hooks, which DataParallel's buckets rely on."""
import numpy as np

import gdnflow as gf
from gdnflow import autograd


def test_a_leaf_used_twice_fires_once_with_its_complete_gradient():
    w = gf.tensor([1.0, 2.0], requires_grad=True)
    seen = []
    handle = autograd.on_gradient_ready(w, lambda t: seen.append(t.grad.numpy().copy()))
    ((w * 3.0).sum() + (w * w).sum()).backward()
    handle.remove()
    assert len(seen) == 1
    np.testing.assert_allclose(seen[0], 3.0 + 2 * np.array([1.0, 2.0]))


def test_hooks_fire_in_backward_order_and_end_hook_last():
    a = gf.tensor([1.0], requires_grad=True)
    b = gf.tensor([2.0], requires_grad=True)
    events = []
    handles = [autograd.on_gradient_ready(a, lambda t: events.append("a")),
               autograd.on_gradient_ready(b, lambda t: events.append("b")),
               autograd.on_backward_end(lambda: events.append("end"))]
    ((a * 2.0).exp() * b).sum().backward()     # b's gradient is complete before a's
    for handle in handles:
        handle.remove()
    assert events == ["b", "a", "end"]
    ((a * 2.0) * b).sum().backward()
    assert events == ["b", "a", "end"]          # removed: no more calls


def test_a_leaf_the_backward_does_not_reach_gets_no_call():
    used = gf.tensor([1.0], requires_grad=True)
    unused = gf.tensor([1.0], requires_grad=True)
    seen = []
    handle = autograd.on_gradient_ready(unused, seen.append)
    (used * 2.0).sum().backward()
    handle.remove()
    assert seen == []
