"""First layers (image channels in) with their epilogue, per convolution algorithm.

Run on the GPU machine (``source .gpu/env.sh``)::

    python3 benchmarks/bench_stem_epilogue.py --out benchmarks/results/stem_epilogue.md

Each layer runs through ``gdnflow.ops.conv2d`` with its bias and activation, forced
onto each of the grouped direct kernel, im2col + the direct product and im2col +
GEMM (a planner subclass that answers with that algorithm), so that the epilogue
pass the im2col paths need is timed too (``ConvPlanner``'s autotune times the
convolution alone). GPU time of 20 back-to-back calls between CUDA events, median
of 5. The rule it backs: ``MAX_ODD_PLANE_STEM_MULTIPLY_ADDS`` in
``gdnflow/ops/conv/algorithms/grouped.py``.
"""
import argparse
import datetime
import statistics

import numpy as np

import gdnflow as gf
from gdnflow import ops
from gdnflow.backends import cuda
from gdnflow.config import settings
from gdnflow.ops.conv.algorithms.grouped import GroupedDirect
from gdnflow.ops.conv.algorithms.im2col import Im2colGemm
from gdnflow.ops.conv.algorithms.pointwise import Im2colDirect
from gdnflow.ops.conv.geometry import ConvGeometry
from gdnflow.ops.conv.planning import ConvPlanner

ALGORITHMS = (GroupedDirect, Im2colDirect, Im2colGemm)
#: (name, input shape, C_out, window, stride, padding, activation)
LAYERS = [
    ("SqueezeNet 1.1 3x3/2 to 64 (111² out)", (8, 3, 224, 224), 64, 3, 2, 0, "relu"),
    ("SqueezeNet 1.1 3x3/2 to 64 (111² out)", (16, 3, 224, 224), 64, 3, 2, 0, "relu"),
    ("SqueezeNet 1.1 3x3/2 to 64 (111² out)", (32, 3, 224, 224), 64, 3, 2, 0, "relu"),
    ("SqueezeNet 1.1 3x3/2 to 64 (111² out)", (64, 3, 224, 224), 64, 3, 2, 0, "relu"),
    ("Inception v3 3x3/2 to 32 (149² out)", (32, 3, 299, 299), 32, 3, 2, 0, "relu"),
    ("MobileNetV2 3x3/2 to 32 (112² out)", (32, 3, 224, 224), 32, 3, 2, 1, "relu6"),
    ("MobileNetV2 3x3/2 to 32 (112² out)", (64, 3, 224, 224), 32, 3, 2, 1, "relu6"),
    ("VGG 3x3/1 to 64 (224² out)", (8, 3, 224, 224), 64, 3, 1, 1, "relu"),
    ("ResNet 7x7/2 to 64 (112² out)", (8, 3, 224, 224), 64, 7, 2, 3, "relu"),
    ("ResNet 7x7/2 to 64 (112² out)", (32, 3, 224, 224), 64, 7, 2, 3, "relu"),
    ("codec 5x5/2 to 128, 768x512 (no activation)", (1, 3, 512, 768), 128, 5, 2, 2, None),
]


class Forced(ConvPlanner):
    """The planner, answering ``algorithm`` for every forward it supports."""

    def __init__(self, algorithm):
        super().__init__(autotune=False)
        self.algorithm = algorithm

    def choose(self, g, stage):
        if stage == "forward" and self.algorithm.supports(g):
            return self.algorithm
        return super().choose(g, stage)


def time_layer(x, w, b, stride, padding, activation, repeats=20, rounds=5):
    """Median microseconds of one forward (GPU time of ``repeats`` back-to-back calls)."""
    import pycuda.driver as drv
    ops.conv2d(x, w, b, stride, padding, activation=activation)
    runtime = cuda.get_runtime()
    times = []
    for _ in range(rounds):
        start, end = drv.Event(), drv.Event()
        start.record(runtime.stream)
        for _ in range(repeats):
            ops.conv2d(x, w, b, stride, padding, activation=activation)
        end.record(runtime.stream)
        end.synchronize()
        times.append(end.time_since(start) * 1000 / repeats)
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the table here too")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    default = ConvPlanner(autotune=False)
    lines = ["| layer | batch | multiply-adds (M) | "
             + " | ".join(f"{a.name} µs" for a in ALGORITHMS) + " | planner's choice |",
             "|---|---|---|" + "---|" * len(ALGORITHMS) + "---|"]
    with gf.no_grad():
        for name, shape, c_out, k, stride, padding, activation in LAYERS:
            x = gf.tensor(rng.standard_normal(shape, dtype=np.float32), device="cuda")
            w = gf.tensor(rng.standard_normal((c_out, shape[1], k, k), dtype=np.float32) * 0.1,
                          device="cuda")
            b = gf.tensor(rng.standard_normal(c_out, dtype=np.float32), device="cuda")
            cells = []
            for algorithm in ALGORITHMS:
                settings.conv_planner = Forced(algorithm)
                try:
                    cells.append(f"{time_layer(x, w, b, stride, padding, activation):.0f}")
                finally:
                    settings.conv_planner = None
            y = ops.conv2d(x, w, b, stride, padding, activation=activation)
            g = ConvGeometry(shape[0], shape[1], shape[2], shape[3], c_out,
                                               k, k, (stride, stride), (padding,) * 4, (1, 1), 1)
            assert (g.oh, g.ow) == y.shape[2:]
            macs = g.n * c_out * g.oh * g.ow * shape[1] * k * k
            lines.append(f"| {name} | {shape[0]} | {macs / 1e6:.0f} | " + " | ".join(cells)
                         + f" | {default.choose(g, 'forward').name} |")
    import pycuda.driver as drv
    lines += ["", f"GPU: {drv.Context.get_device().name()}; date: {datetime.date.today()}; forward with bias and the "
              "activation named, float32, median of 5 x 20 back-to-back calls"]
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as file:
            file.write(table + "\n")


if __name__ == "__main__":
    main()
