"""Load every file ``export_models.py`` wrote with gdnflow and compare it with onnxruntime.

Runs with gdnflow's venv (onnx and onnxruntime from gdnflow[test]), on NumPy:

    python benchmarks/torchvision_onnx/check_models.py /tmp/tv_onnx \\
        --out benchmarks/torchvision_onnx/results_numpy.md

Each file gets the same seeded uniform [0, 1) input in both runtimes. The
table gives, per family and opset, whether gdnflow loads and runs it and the
largest error relative to the output's scale, max |gdnflow - onnxruntime| /
max |onnxruntime| (the outputs are logits or per-pixel scores of random
weights: dividing by each element's own value would blow up where a score
crosses zero), or the first line of gdnflow's refusal. Goal: 1e-5.
"""
import argparse
import datetime
import json
import os
import platform
import time

import numpy as np
import onnx
import onnxruntime

import gdnflow as gf
from gdnflow.io import onnx as gdnflow_onnx
from gdnflow.version import __version__ as gdnflow_version

TOLERANCE = 1e-5
#: The families issue #29 names, first in the table; the script exports more.
ISSUE_FAMILIES = ("ResNet", "MobileNetV3", "EfficientNet", "RegNet", "ShuffleNetV2", "SqueezeNet",
                  "DenseNet", "MNASNet", "ConvNeXt", "GoogLeNet", "Inception v3", "FCN",
                  "DeepLabV3", "LRASPP")


def check(path, shape, seed=0):
    """(loads, relative error or None, note) for one file."""
    x = np.random.default_rng(seed).random(shape, dtype=np.float32)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    expected = session.run(None, {session.get_inputs()[0].name: x})[0]
    try:
        model = gdnflow_onnx.load(path, device="numpy")
    except Exception as error:
        return False, None, _first_line(error).replace(f"{path}: ", "")
    start = time.perf_counter()
    try:
        with gf.no_grad():
            actual = model(gf.tensor(x, device="numpy"))
        actual = np.asarray(actual.numpy() if hasattr(actual, "numpy") else actual)
    except Exception as error:
        return True, None, "forward failed: " + _first_line(error)
    seconds = time.perf_counter() - start
    if actual.shape != expected.shape:
        return True, None, f"output shape {actual.shape}, onnxruntime {expected.shape}"
    if not np.any(expected):
        return True, None, "onnxruntime's output is all zeros: nothing to compare"
    error = float(np.max(np.abs(actual - expected)) / np.max(np.abs(expected)))
    return True, error, f"{seconds:.1f} s forward"


def _first_line(error):
    """The error's first line, its first clause only when it lists several (one per node)."""
    text = str(error).strip()
    text = text.splitlines()[0] if text else ""
    clauses = text.split("; ")
    if len(clauses) > 1:
        text = f"{clauses[0]} (and {len(clauses) - 1} more)"
    return f"{type(error).__name__}: {text}"


def table(manifest, results):
    """The markdown report: versions, then one row per file."""
    lines = [
        "# torchvision families through gdnflow's ONNX importer, NumPy backend",
        "",
        f"Made {datetime.date.today().isoformat()} by `benchmarks/torchvision_onnx/check_models.py` "
        "from the files `export_models.py` wrote (seeded random weights, eval mode, "
        "TorchScript exporter).",
        f"torch {manifest['torch']}, torchvision {manifest['torchvision']}, onnx {onnx.__version__}, "
        f"onnxruntime {onnxruntime.__version__}, gdnflow {gdnflow_version}, "
        f"NumPy {np.__version__}, Python {platform.python_version()}.",
        "",
        "Error: max |gdnflow - onnxruntime| / max |onnxruntime| on one seeded "
        f"uniform [0, 1) input; goal {TOLERANCE:g}. Note: the refusal or failure, else one "
        "NumPy forward's wall time (a shared 2-core machine: indicative only).",
        "",
        f"{sum(error is not None and error <= TOLERANCE for _, error, _ in results)} of "
        f"{len(results)} files load and match within {TOLERANCE:g}.",
        "",
        "| family | model | opset | input | loads | runs | max rel. error | within 1e-5 | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rows = sorted(zip(manifest["models"], results), key=lambda row: (
        row[0]["family"] not in ISSUE_FAMILIES))
    for entry, (loads, error, note) in rows:
        shape = "x".join(map(str, entry["input_shape"])) if "input_shape" in entry else ""
        error_text = "" if error is None else f"{error:.1e}"
        within = "" if error is None else ("yes" if error <= TOLERANCE else "**no**")
        runs = "yes" if error is not None else "no"
        note = note.replace("|", "\\|")
        family = entry["family"] + ("" if entry["family"] in ISSUE_FAMILIES else " (more)")
        lines.append(f"| {family} | {entry['model']} | {entry['opset']} | {shape} | "
                     f"{'yes' if loads else 'no'} | {runs} | {error_text} | {within} | {note} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    """Check every file in the manifest; print each result and write the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="the folder export_models.py wrote")
    parser.add_argument("--out", help="where to write the markdown table")
    parser.add_argument("--families", nargs="*", help="check only these families")
    args = parser.parse_args(argv)
    with open(os.path.join(args.folder, "manifest.json")) as file:
        manifest = json.load(file)
    if args.families:
        manifest["models"] = [e for e in manifest["models"] if e["family"] in args.families]
    results = []
    for entry in manifest["models"]:
        if entry.get("file") is None:
            results.append((False, None, "export failed: " + entry.get("export_error", "")))
        else:
            results.append(check(os.path.join(args.folder, entry["file"]), entry["input_shape"]))
        loads, error, note = results[-1]
        print(f"{entry['family']:13s} opset {entry['opset']}: loads={loads} "
              f"error={'-' if error is None else f'{error:.1e}'} {note}", flush=True)
    report = table(manifest, results)
    if args.out:
        with open(args.out, "w") as file:
            file.write(report)
    else:
        print(report)


if __name__ == "__main__":
    main()
