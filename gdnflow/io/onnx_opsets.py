"""Which version of each ONNX operator a model's opset selects, checked at load.

A model imports one opset of the default ONNX domain, and each operator in it
takes the form of its latest version at or below that opset: a Softmax of
an opset-12 model is Softmax-11 (the input flattened to 2-D at ``axis``), of
an opset-13 model Softmax-13 (one axis). The handlers read ``node.opset``
(the model's opset) where the forms differ: an attribute that became an
input (Slice 10, Clip and Pad 11, Squeeze, Unsqueeze, Split and ReduceSum
13, the other reductions 18, TopK's k 10), Softmax's axis (13), Resize's
inputs and roundings (10, 11), BatchNormalization's spatial (before 9),
Dropout's mask type (10) and GroupNormalization's scale (per group before
21). gdnflow reads the forms of opsets 7 and later (``FIRST_OPSET``):
docs/onnx_coverage.md lists, per operator, the opsets 7 to 21 checked
against onnxruntime.

:func:`version_problems` checks one node against the schema of its version
(from the onnx package): an operator its opset does not have yet, a form
older than opset 7, an attribute or an input its version does not take
(the axes attribute of a ReduceMean-18, whose axes are an input) are each
refused at load with a phrase naming the operator's version, rather than
run by a handler reading the other form.
"""
import functools

#: The oldest opset whose operator forms gdnflow reads.
FIRST_OPSET = 7
#: The newest opset whose forms tests/io/test_onnx_opsets.py checks (later ones run
#: where their operators kept a form gdnflow reads).
LAST_CHECKED_OPSET = 21


@functools.lru_cache(maxsize=None)
def schema(op_type, opset):
    """The onnx schema of ``op_type`` in ``opset`` (of the default domain), or None."""
    from onnx import defs     # local import: onnx is optional, loaded on first use
    try:
        return defs.get_schema(op_type, max_inclusive_version=opset)
    except defs.SchemaError:
        return None


def version(op_type, opset):
    """The version of ``op_type`` that ``opset`` selects (its ``since_version``), or None."""
    found = schema(op_type, opset)
    return None if found is None else found.since_version


def versions(op_type, first=FIRST_OPSET, last=LAST_CHECKED_OPSET):
    """{version: the first opset in ``first``..``last`` that selects it} of ``op_type``."""
    found = {}
    for opset in range(first, last + 1):
        number = version(op_type, opset)
        if number is not None:
            found.setdefault(number, opset)
    return found


def version_problems(op_type, opset, attribute_names, input_count):
    """Phrases naming what of a node of ``op_type`` (default domain) its version in
    ``opset`` does not have; empty when the node has the form of its version.

    ``attribute_names`` are the node's attributes, ``input_count`` the length of its
    input list (omitted optional inputs included).
    """
    found = schema(op_type, opset)
    if found is None:
        first = _first_opset(op_type)
        since = f"ONNX added it in opset {first}" if first else "the onnx package lacks it"
        return [f"{op_type} in opset {opset} ({since})"]
    name = f"{op_type}-{found.since_version}"
    successor = version(op_type, FIRST_OPSET)
    if found.since_version != successor and found.since_version < FIRST_OPSET:
        span = (f"opset {found.since_version}" if found.since_version == successor - 1
                else f"opsets {found.since_version} to {successor - 1}")
        return [f"{name} (the form of {span}; gdnflow reads the forms of opset {FIRST_OPSET} "
                "and later: convert the model with onnx.version_converter)"]
    problems = [f"attribute {a} (not one of {name}'s, opset {opset})"
                for a in attribute_names if a not in found.attributes]
    least, most = _input_counts(found)
    if not least <= input_count <= most:
        bound = f"at least {least}" if input_count < least else f"at most {most}"
        problems.append(f"{input_count} input{'s' if input_count != 1 else ''} ({name}, opset "
                        f"{opset}, takes {bound})")
    return problems


def _first_opset(op_type):
    """The opset that introduced ``op_type``, or None where the onnx package lacks it."""
    return next((opset for opset in range(1, 100) if schema(op_type, opset) is not None), None)


def _input_counts(found):
    """(the fewest, the most) inputs a schema takes: up to its last required one; all,
    or unbounded after a variadic one (whose own count onnx's checker sees to)."""
    from onnx import defs     # local import: onnx is optional, loaded on first use
    options = [p.option for p in found.inputs]
    single = defs.OpSchema.FormalParameterOption.Single
    least = max((i + 1 for i, option in enumerate(options) if option == single), default=0)
    variadic = defs.OpSchema.FormalParameterOption.Variadic in options
    return least, (10 ** 6 if variadic else len(options))
