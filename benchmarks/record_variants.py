"""Record the per-shape CUDA module variants of gdnflow's bundled workloads: the shipped journal.

    python benchmarks/record_variants.py          # on a GPU: refreshes its (arch, SM count) entry
    python benchmarks/record_variants.py --out /tmp/known_variants.json --workloads mobilenet_v2
    python benchmarks/record_variants.py --device numpy --workloads mobilenet_v2   # dry run

Runs each workload once in this process on the GPU: MobileNetV2 and VGG16
forward (eval, no_grad, 224x224) at batch 1 and 64, the shipped codec
(factorized prior, N=128, M=192, quality 2) compressing and decompressing a
768x512 image, and the factorized prior's training step (batch 16, 256x256:
the eager step and the captured one ``gdnflow train`` runs). Then it takes
every module the process loaded (``Builds.loaded``) that is a variant of
gdnflow's own ``cuda_src`` not already compiled ahead without a journal
(:func:`~gdnflow.backends.cuda.kernel_builds.prefetch_list`), and writes them
under ``"<arch>/<sm_count>"`` of the shipped journal
(``gdnflow/backends/cuda/known_variants.json``; other entries are kept),
atomically. The variants are those the operators really loaded, with the
GPU's SM count and the arrays' real alignments: recorded, not computed.
The kernel cache plays no part (a warm one only makes the run faster). The
convolution planner runs its heuristic (autotuning would load every
candidate algorithm's modules).
"""
import argparse
import datetime
import json
import tempfile
from pathlib import Path

import numpy as np

import gdnflow as gf
from gdnflow import benchmarking
from gdnflow.backends import cuda
from gdnflow.backends.cuda import variant_journal
from gdnflow.backends.cuda.kernel_builds import prefetch_list
from gdnflow.codec import pretrained
from gdnflow.io.files import write_bytes_atomic
from gdnflow.models import mobilenet_v2, vgg16
from gdnflow.ops.conv.planning import ConvPlanner
from gdnflow.train import TrainConfig, Trainer
from gdnflow.version import __version__

SIDE = 224
BATCHES = (1, 64)
CODEC_SIZE = (512, 768)             # height, width
TRAIN_BATCH, TRAIN_SIDE = 16, 256


def classifier(build):
    """A workload running ``build(device, rng)``'s model forward at each of :data:`BATCHES`."""
    def run(device):
        rng = np.random.default_rng(0)
        model = build(device=device, rng=rng).eval()
        for batch in BATCHES:
            x = gf.tensor(rng.standard_normal((batch, 3, SIDE, SIDE), dtype=np.float32),
                          device=device)
            with gf.no_grad():
                model(x).numpy()
    return run


def codec(device):
    """The shipped codec compressing and decompressing a 768x512 image."""
    image = np.random.default_rng(0).integers(0, 256, (*CODEC_SIZE, 3), dtype=np.uint8)
    shipped = pretrained("factorized_prior", quality=2, device=device)
    shipped.decompress(shipped.compress(image))


def training(device):
    """The factorized prior's training step, eager and captured."""
    x = np.random.default_rng(0).uniform(0, 1, (TRAIN_BATCH, 3, TRAIN_SIDE, TRAIN_SIDE))
    x = x.astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="gdnflow-record-") as folder:
        trainer = Trainer(TrainConfig(model="factorized_prior", N=128, M=192,
                                      batch_size=TRAIN_BATCH, crop=TRAIN_SIDE, device=device,
                                      out_dir=folder, quiet=True))
        trainer.train_step(x)
        if device == "cuda":            # the captured step is a CUDA graph
            trainer.queue_step(x)
            trainer.flush()


#: Name -> function(device) of every workload, in the order they run.
WORKLOADS = {"mobilenet_v2": classifier(mobilenet_v2), "vgg16": classifier(vgg16),
             "codec": codec, "factorized_prior_training": training}


def recorded_variants():
    """The variants of gdnflow's own sources this process loaded that the prefetch does not
    already compile without a journal, in the order first loaded (the first miss queues them
    in this order: MobileNetV2 at batch 1, the commonest first run, comes first)."""
    from gdnflow.backends.cuda import kernels    # local import: PyCUDA, on the GPU only
    plain = set(prefetch_list())
    found = [(name, defines) for file, defines in kernels.builds().loaded
             for name in [variant_journal.own_source_name(file)]
             if name is not None and (name, defines) not in plain]
    return list(dict.fromkeys(found))


def updated_journal(path, arch, sm_count, variants, names):
    """The shipped journal ``path`` with the entry of (``arch``, ``sm_count``) replaced."""
    journal = variant_journal.load_shipped(path) or {"format": variant_journal.SHIPPED_FORMAT}
    journal["about"] = ("Per-shape CUDA module variants of gdnflow's bundled workloads, per GPU "
                        "architecture and SM count, compiled ahead at a process's first kernel "
                        "cache miss and by gdnflow build-kernels (docs/kernels.md). Recorded on "
                        "the GPU by: python benchmarks/record_variants.py")
    recorded = journal.setdefault("recorded", {})
    recorded[variant_journal.shipped_key(arch, sm_count)] = {
        "gpu": benchmarking.gpu_name(), "gdnflow": __version__,
        "date": datetime.date.today().isoformat(), "workloads": names,
        "variants": [variant_journal.entry(file, defines) for file, defines in variants]}
    journal["recorded"] = dict(sorted(recorded.items()))
    return journal


def journal_text(journal):
    """The journal as JSON text, indented, with one variant per line (a refresh's diff reads
    as the variants added, removed or moved)."""
    journal = json.loads(json.dumps(journal))       # a copy: its variants become placeholders
    compact = {}
    for block in journal["recorded"].values():
        placeholders = []
        for item in block["variants"]:
            placeholders.append(f"@variant{len(compact)}")
            compact[placeholders[-1]] = json.dumps(item, separators=(",", ":"))
        block["variants"] = placeholders
    text = json.dumps(journal, indent=1)
    for placeholder, item in compact.items():
        text = text.replace(f'"{placeholder}"', item, 1)
    return text + "\n"


def main():
    """Run the workloads and write the journal (or, on NumPy, only run them)."""
    known = WORKLOADS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=variant_journal.SHIPPED,
                        help="the journal to update (default: gdnflow's shipped one)")
    parser.add_argument("--workloads", default=",".join(known),
                        help=f"comma-separated, from {', '.join(known)} (default: all)")
    parser.add_argument("--device", choices=("cuda", "numpy"), default="cuda",
                        help="numpy: a dry run of the workloads (nothing is recorded)")
    args = parser.parse_args()
    names = [name.strip() for name in args.workloads.split(",")]
    unknown = [name for name in names if name not in known]
    if unknown:
        parser.error(f"unknown workloads {unknown}; expected some of {list(known)}")
    with gf.config.override(conv_planner=ConvPlanner(autotune=False)):
        for name in names:
            print(f"running {name} on {args.device} ...", flush=True)
            known[name](args.device)
    if args.device != "cuda":
        print("dry run on NumPy: nothing recorded")
        return
    runtime = cuda.get_runtime()
    variants = recorded_variants()
    journal = updated_journal(args.out, runtime.arch, runtime.sm_count, variants, names)
    write_bytes_atomic(args.out, journal_text(journal).encode(), overwrite=True)
    print(f"{len(variants)} variants for {runtime.arch} with {runtime.sm_count} SMs "
          f"({runtime.name}) written to {args.out}")


if __name__ == "__main__":
    main()
