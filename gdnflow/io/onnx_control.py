"""ONNX control flow: If, and Loop with a trip count or condition known on the host.

gdnflow runs one graph of tensor operations, so a branch or a loop count must
be known without reading float data off the device: an If or Loop steered by
a value computed from float inputs or weights (a comparison of activations)
is refused at load, in one line naming the node. A node with subgraphs
takes, after its declared inputs, the outer values its subgraphs read
(``node.captured``; see :class:`gdnflow.io.onnx._Node`), so an If whose
condition is a constant, or shape arithmetic on static shapes (Shape, Size,
Gather, Equal, Not... all host operators), folds at load into its taken
branch's values. A condition known only at run time on the host (a Shape of
an input with a symbolic dimension, a bool graph input) picks the branch
when the node runs.

Loop runs its body ``M`` times (the trip count) while its condition holds,
with the body's loop-carried values fed back and its scan outputs stacked
along a new first axis. Scan is not run (refused at load with the operators
inside its body).
"""
import numpy as np

from gdnflow import ops
from gdnflow.io.onnx_values import is_host


def _on_data(what):
    return (f"{what} computed from float data (gdnflow runs one graph: it must be a constant "
            "or shape arithmetic, known on the host)")


def _known_on_host(node, value, what):
    """``value`` (a condition or count) as a host array, refusing a device tensor."""
    if not is_host(value):
        node.fail(_on_data(what))
    return value


def _controls(step):
    """(what, value name) of the inputs that steer an If or a Loop."""
    if step.op_type == "If":
        return [("an If condition", step.inputs[0])]
    if step.op_type == "Loop":
        return list(zip(("a Loop trip count", "a Loop condition"), step.inputs[:2]))
    return []


def on_data(steps, data):
    """Phrases naming each If or Loop of ``steps`` that a value computed from
    ``data`` (the float inputs and weights) steers: a comparison reads float
    data to the host, so this is checked on the graph, at load. Shape and Size
    read shapes only."""
    data, found = set(data), []
    for step in steps:
        found += [f"node {step.name} ({step.op_type}): {_on_data(what)} is not supported"
                  for what, name in _controls(step) if name in data]
        if step.op_type not in ("Shape", "Size") and data.intersection(step.inputs):
            data.update(step.outputs)
    return found


def known_branch(step, constants):
    """The branch an If takes when its condition is among ``constants``, else None."""
    if step.op_type != "If" or step.inputs[0] not in constants:
        return None
    return "then_branch" if bool(constants[step.inputs[0]].reshape(-1)[0]) else "else_branch"


def _outer(node, inputs):
    """The outer values the node's subgraphs read, by name."""
    return dict(zip(node.captured, inputs[node.declared:]))


def _if(node, inputs, device):
    condition = _known_on_host(node, inputs[0], "an If condition")
    branch = "then_branch" if bool(condition.reshape(-1)[0]) else "else_branch"
    return node.subgraphs[branch].run(_outer(node, inputs), device)


def _stacked(values):
    """One scan output's per-iteration values stacked along a new first axis."""
    if all(is_host(v) for v in values):
        return np.stack(values)
    return ops.concat([ops.reshape(v, (1,) + tuple(v.shape)) for v in values], axis=0)


def _loop(node, inputs, device):
    trip_count, condition = (list(inputs[:node.declared]) + [None, None])[:2]
    carried = list(inputs[2:node.declared])
    if trip_count is None and condition is None:
        node.fail("a Loop with neither trip count nor condition (it would not end)")
    limit = None if trip_count is None else int(
        _known_on_host(node, trip_count, "a Loop trip count").reshape(()))
    running = True if condition is None else bool(
        _known_on_host(node, condition, "a Loop condition").reshape(()))
    body, outer = node.subgraphs["body"], _outer(node, inputs)
    scans, iteration = [], 0
    while running and (limit is None or iteration < limit):
        bound = [np.array(iteration, np.int64), np.array(running)] + carried
        results = body.run({**outer, **dict(zip(body.input_names, bound))}, device)
        running = bool(_known_on_host(node, results[0], "a Loop condition").reshape(()))
        carried = results[1:1 + len(carried)]
        scans.append(results[1 + len(carried):])
        iteration += 1
    count = len(node.outputs) - len(carried)
    if count and not scans:
        node.fail("a Loop that runs no iteration but has scan outputs (their shape is unknown)")
    return carried + [_stacked([s[k] for s in scans]) for k in range(count)]


HANDLERS = {"If": _if, "Loop": _loop}

#: Both may run on host values (and fold at load when every value they read is known).
HOST_OPS = {"If", "Loop"}
