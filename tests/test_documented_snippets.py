"""The Python examples in README.md and docs/compiled_step.md run as written, on NumPy,
and the values their comments claim (``expr  # value``) are what the code gives:
the documentation cannot drift from the program without a test failing."""
import ast
import contextlib
import io
import pathlib
import re

import pytest

import gdnflow as gf

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: Files whose ```python blocks are complete programs (others show fragments).
DOCUMENTS = ("README.md", "docs/compiled_step.md")


def python_blocks(path):
    """The ```python blocks of a markdown file, in order; the second compiled_step.md block
    is a fragment continuing the first, and is skipped (it needs ``batches``)."""
    blocks = re.findall(r"^```python\n(.*?)^```", path.read_text(), re.S | re.M)
    return [b for b in blocks if "for batch in batches" not in b]


def claimed_values(source):
    """(expression, claimed value) for each statement line ``expr  # value`` whose comment
    is a Python literal: ``x.grad.numpy().shape  # (8, 3, 32, 32)``."""
    claims = []
    for line in source.splitlines():
        code, _, comment = line.partition("#")
        try:
            value = ast.literal_eval(comment.strip())
            ast.parse(code.strip(), mode="eval")
        except (ValueError, SyntaxError):
            continue
        claims.append((code.strip(), value))
    return claims


CASES = [(name, i) for name in DOCUMENTS for i in range(len(python_blocks(ROOT / name)))]


@pytest.mark.parametrize("name, index", CASES)
def test_documented_python_runs_as_written(name, index):
    source = python_blocks(ROOT / name)[index]
    namespace = {"__name__": "__snippet__"}
    previous = gf.default_device()
    gf.set_default_device("numpy")
    try:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(source, f"{name} block {index + 1}", "exec"), namespace)
        for expression, value in claimed_values(source):
            assert eval(expression, namespace) == value, (name, expression)
        # An example that prints its loss has to learn: the last well below the first.
        losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", printed.getvalue())]
        if losses:
            assert len(losses) >= 2 and losses[-1] < 0.2 * losses[0], losses
    finally:
        gf.set_default_device(previous)


def test_the_documents_hold_python_examples():
    assert len(CASES) >= 2
    assert claimed_values(python_blocks(ROOT / "README.md")[0]) == [
        ("x.grad.numpy().shape", (8, 3, 32, 32))]
