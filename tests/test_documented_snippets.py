"""The Python examples in README.md and the guides in docs/ run as written, on NumPy,
and the values their comments claim (``expr  # value``) are what the code gives:
the documentation cannot drift from the program without a test failing.

Each example runs in a fresh folder holding the files a reader is assumed to
have: ``photo.png`` (a photograph) and ``mobilenet_v2.onnx`` (a MobileNetV2
as torch.onnx exports it, random weights)."""
import ast
import contextlib
import io
import pathlib
import importlib.util
import re
import shlex

import numpy as np
import pytest
from PIL import Image

from codec_kit import smooth_image
from gdnflow.cli import build_parser, main as cli_main
from gdnflow.codec import read_image

import gdnflow as gf

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: Files whose ```python blocks are complete programs (others show fragments).
DOCUMENTS = ("README.md", "docs/compiled_step.md", "docs/codecs.md", "docs/models.md",
             "docs/framework.md")


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


@pytest.fixture(scope="module")
def reader_files(tmp_path_factory):
    """A folder with the files the examples name: photo.png and mobilenet_v2.onnx."""
    folder = tmp_path_factory.mktemp("reader")
    Image.fromarray(smooth_image(np.random.default_rng(0), 96, 128)).save(folder / "photo.png")
    if importlib.util.find_spec("onnx") is not None:
        from onnx_mobilenet import mobilenet_v2_onnx  # local import: needs the onnx package
        mobilenet_v2_onnx(folder / "mobilenet_v2.onnx")
    return folder


@pytest.mark.parametrize("name, index", CASES)
def test_documented_python_runs_as_written(name, index, reader_files, monkeypatch):
    source = python_blocks(ROOT / name)[index]
    if "onnx" in source:
        pytest.importorskip("onnx")
    monkeypatch.chdir(reader_files)
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
    assert {name for name, _ in CASES} == set(DOCUMENTS)
    claims = [c for block in python_blocks(ROOT / "README.md") for c in claimed_values(block)]
    assert ("x.grad.numpy().shape", (8, 3, 32, 32)) in claims


def gdnflow_command_lines(path):
    """The ``gdnflow ...`` commands of a markdown file's ```bash blocks, comments cut,
    continuation lines joined, lines split at ``&&``, ``||``, ``;`` and ``|`` (the README's
    first line runs ``gdnflow train`` after the install), leading ``NAME=value``
    environment settings dropped."""
    lines = []
    for block in re.findall(r"^```bash\n(.*?)^```", path.read_text(), re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            starts = [0] + [i + 1 for i, w in enumerate(words) if w in ("&&", "||", ";", "|")]
            for start, end in zip(starts, starts[1:] + [len(words) + 1]):
                command = words[start:end - 1]
                while command and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", command[0]):
                    command = command[1:]
                if command[:1] == ["gdnflow"]:
                    lines.append(command)
    return lines


COMMAND_DOCUMENTS = ("README.md", "docs/codecs.md", "docs/models.md", "docs/plugins.md",
                     "docs/kernels.md", "checkpoints/README.md")


@pytest.mark.parametrize("name", COMMAND_DOCUMENTS)
def test_documented_commands_are_valid_command_lines(name):
    lines = gdnflow_command_lines(ROOT / name)
    assert lines, f"{name} shows no gdnflow command"
    parser = build_parser()
    for words in lines:
        try:
            parser.parse_args(words[1:])
        except SystemExit:
            pytest.fail(f"{name}: {' '.join(words)} is not a valid gdnflow command line")


def test_the_readme_compress_commands_run_as_written(reader_files, monkeypatch, capsys):
    # The "Compress a photo" block, in a folder holding the reader's photo.png, on NumPy.
    block = next(b for b in re.findall(r"^```bash\n(.*?)^```", (ROOT / "README.md").read_text(),
                                       re.S | re.M) if "gdnflow compress" in b)
    monkeypatch.chdir(reader_files)
    monkeypatch.setenv("GDNFLOW_DEVICE", "numpy")
    for line in block.splitlines():
        assert cli_main(shlex.split(line, comments=True)[1:] + ["--force"]) == 0, line
    assert "bpp" in capsys.readouterr().out
    assert read_image("photo_hat.png").shape == read_image("photo.png").shape
