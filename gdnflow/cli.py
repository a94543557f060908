"""gdnflow: train and run GDN image codecs, run CNNs imported from ONNX or Keras, and
check operator plugins.

    gdnflow demo              fine-tune a shipped codec briefly, code two unseen photos beside JPEG and WebP
    gdnflow info              what gdnflow sees: version, devices, operators, CUDA sources
    gdnflow info --include    the folder of gdnflow_common.cuh, for nvcc -I
    gdnflow info FILE         what a checkpoint, Keras or ONNX file holds
    gdnflow classify IMAGE... top-5 classes of images (gdnflow.classify)
    gdnflow convert IN OUT.h5 an ONNX or Keras file as a gdnflow checkpoint
    gdnflow train             train a GDN image-compression autoencoder (--resume continues a run)
    gdnflow bench             MobileNetV2 and VGG16 inference: gdnflow against PyTorch
    gdnflow compress IMAGE... compress images to .gdn files with a codec checkpoint (gdnflow.codec)
    gdnflow decompress FILE.. decode .gdn files to images (finds the checkpoint by model id)
    gdnflow eval              codec checkpoints against JPEG, WebP, JPEG 2000: tables, BD-rates, RD plot
    gdnflow prune MODEL.h5    magnitude pruning of a checkpoint's convolutions (gdnflow.sparse)
    gdnflow plugins           installed operator plugins: loaded? operators? does the CUDA compile?
    gdnflow plugin-check NAME gradient (and CUDA-against-NumPy) check of a plugin's operators
    gdnflow build-kernels     compile the CUDA modules into the kernel cache ahead of time

Errors are one line ``gdnflow CMD: message`` on stderr; the exit status is 0,
1 on a failure, 2 on a usage error (a bad option or value), 130 on Ctrl-C and
141 on a closed pipe; ``gdnflow --debug CMD`` (or ``GDNFLOW_DEBUG=1``) shows
tracebacks (:mod:`gdnflow.commandline`).
"""
import argparse
import re
import sys
import time

from gdnflow import classify, plugins, registry
from gdnflow.backends import cuda, default_device
from gdnflow.backends.cuda.kernel_builds import Builds, prefetch_list
from gdnflow.backends.cuda.kernel_cache import CACHE_VARIABLE, KernelCache
from gdnflow.backends.cuda.sources import resolve, source_dir
from gdnflow.backends.cuda.variant_journal import journaled_variants
from gdnflow.codec.cli import add_codec_parsers
from gdnflow.demo import add_demo_parser
from gdnflow.commandline import CommandParser, command_parser, nonnegative_int, positive_int, run
from gdnflow.errors import BackendUnavailableError, KernelCompileError
from gdnflow.inference_bench import add_bench_parser
from gdnflow.sparse import describe as describe_sparse
from gdnflow.sparse.cli import add_prune_parser
from gdnflow.train.cli import add_train_parser
from gdnflow.version import __version__

#: A GPU architecture as nvcc's -arch takes it: sm_80, sm_90, sm_90a, sm_100f.
GPU_ARCH = r"sm_\d+[af]?"


def cmd_info(args):
    """Print the version, the devices and the operators, plugins' too (or what FILE holds)."""
    if getattr(args, "file", None):
        return classify.cmd_info_file(args)
    if getattr(args, "include", False):
        print(plugins.include_dir())
        return 0
    installed = plugins.load_installed()
    print(f"gdnflow {__version__}")
    if cuda.is_available():
        runtime = cuda.get_runtime()
        print(f"cuda: {runtime.name} ({runtime.arch}, {runtime.sm_count} SMs)")
    else:
        print(f"cuda: unavailable ({cuda.unavailable_reason()})")
    print(f"default device: {default_device()}")
    print(f"CUDA sources: {source_dir()}")
    owners = {name: plugin for plugin in installed if plugin.loaded
              for name in plugin.operators()}
    print("operators: " + " ".join(n for n in registry.names() if n not in owners))
    print("plugin operators: " + (", ".join(
        f"{name} (plugin {plugin.name!r}, {plugin.origin})" for name, plugin in owners.items())
        or "none"))
    broken = [p.name for p in installed if not p.loaded]
    if broken:
        print(f"plugins that failed to load: {', '.join(broken)} (see gdnflow plugins)")
    print(describe_sparse())
    return 0


def cmd_plugins(args):
    """List the installed plugins; exit status 1 if one fails to load or to compile."""
    installed = plugins.load_installed()
    if not installed:
        print(f"no plugins installed (entry-point group {plugins.ENTRY_POINT_GROUP})")
        return 0
    ok = True
    for plugin in installed:
        print(f"{plugin.name}: {plugin.origin}, module {plugin.module}")
        if not plugin.loaded:
            print(f"  NOT LOADED: {plugin.error}")
            ok = False
        else:
            print("  loaded; operators: " + (" ".join(plugin.operators()) or "none"))
        ok = print_kernel_check(plugin, args.arch) is not False and ok
    return 0 if ok else 1


def print_kernel_check(plugin, arch):
    """Compile a plugin's sources and check its kernel declarations, printing what happened.

    Returns False if a source does not compile or a declaration disagrees
    with its kernel, None when nvcc is missing (said as NOT RUN), else True.
    """
    sources = plugin.sources()
    if not sources:
        print("  CUDA: no .cu files")
        return True
    arch = arch or plugins.default_arch()
    try:
        report = plugins.check_kernel_arguments(plugin, arch=arch)
    except BackendUnavailableError as exc:
        print(f"  CUDA: NOT RUN ({exc})")
        return None
    except KernelCompileError as exc:
        print("  CUDA: DOES NOT COMPILE\n    " + str(exc).replace("\n", "\n    "))
        return False
    print(f"  CUDA: {', '.join(p.name for p in sources)} compiled with nvcc ({arch})")
    if not report.ok:
        print("  kernel arguments: WRONG\n    " + "\n    ".join(report.problems))
        return False
    print(f"  kernel arguments: {report.summary()}")
    return True


def cmd_plugin_check(args):
    """gradcheck (and CUDA against NumPy) on each operator, and the plugins' kernels; 1 on failure.

    The last line sums up; with ``--require-gpu`` a run where the CUDA half
    could not run fails too.
    """
    operators = plugins.find_operators(args.name)
    failed = 0
    for op_class in operators:
        try:
            for line in plugins.check_operator(op_class, seed=args.seed):
                print(f"{op_class.op_name}: {line}")
        except Exception as exc:    # report every operator's failure, then exit non-zero
            print(f"{op_class.op_name}: FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
            failed += 1
    owners = {id(p): p for p in map(plugins.plugin_of, operators) if p is not None}
    checks = []
    for plugin in owners.values():
        print(f"{plugin.label}:")
        checks.append(print_kernel_check(plugin, args.arch))
    kernels_ok = False not in checks
    gpu = plugins.cuda_available()
    summary = (f"{len(operators) - failed} of {len(operators)} operators passed"
               + ("" if kernels_ok else "; kernels FAILED")
               + ("; kernel compile check NOT RUN (no nvcc)" if None in checks else "")
               + ("; CUDA against NumPy ran" if gpu else
                  "; CUDA against NumPy NOT RUN (no CUDA device)"))
    if failed or not kernels_ok or (args.require_gpu and not gpu):
        print(f"gdnflow plugin-check: {summary}"
              + ("" if gpu or not args.require_gpu else "; --require-gpu asks for it"),
              file=sys.stderr)
        return 1
    print(f"plugin-check: {summary}")
    return 0


def add_arch_option(parser):
    """``--arch``: the GPU architecture the compile check targets."""
    parser.add_argument("--arch", metavar="SM", type=gpu_arch,
                        help="nvcc target of the compile check, e.g. "
                        f"sm_80 (default: this machine's GPU, else {plugins.DEFAULT_ARCH})")


def cmd_build_kernels(args):
    """Compile CUDA modules into the kernel cache for each --arch; 1 if one fails to compile."""
    sm_count = args.sm_count
    if args.arch:
        arches = args.arch
    elif cuda.is_available():
        runtime = cuda.get_runtime()
        arches, sm_count = [runtime.arch], sm_count or runtime.sm_count
    else:
        raise BackendUnavailableError(
            f"no CUDA device here ({cuda.unavailable_reason()}): name the GPU architecture "
            "with --arch, e.g. --arch sm_90")
    if args.define and not args.files:
        CommandParser.fail("gdnflow build-kernels", "-D/--define applies to the FILEs "
                           "named, and none is (gdnflow's own modules take their defines "
                           "from their operators)")
    defines = tuple(sorted(args.define))
    variants = ([(str(resolve(f)), defines) for f in args.files] if args.files
                else prefetch_list())
    if args.plugins:
        variants += [(str(path), ()) for plugin in plugins.load_installed() if plugin.loaded
                     for path in plugin.sources()]
    failed = []
    for arch in arches:
        started, counts = time.perf_counter(), {"cached": 0, "compiled": 0, "failed": 0}
        # A cache (and its nvcc runner) per architecture: closing the builds stops the runner.
        cache = KernelCache(args.cache)
        builds = Builds(cache, arch, workers=args.workers, prefetch=[])
        journaled = [] if args.files else journaled_variants(cache.folder, arch, sm_count)
        for file, built_with, outcome, error in builds.build(
                list(dict.fromkeys(variants + journaled))):
            counts[outcome] += 1
            with_defines = f" {dict(built_with)}" if built_with else ""
            print(f"  {arch} {outcome:8} {file}{with_defines}", flush=True)
            if error is not None:
                print(error, file=sys.stderr)
                failed.append(f"{file}{with_defines} ({arch})")
        builds.close()
        print(f"{arch}: {counts['compiled']} compiled, {counts['cached']} already cached, "
              f"{counts['failed']} failed, in {time.perf_counter() - started:.1f} s "
              f"({cache.folder})")
    if not args.files:      # the host libraries of gdnflow's own sources
        for source, outcome, error in KernelCache(args.cache).build_host_libraries():
            print(f"  host  {outcome:8} {source}", flush=True)
            if error is not None:
                print(error, file=sys.stderr)
                failed.append(f"{source} (host)")
    if failed:
        raise KernelCompileError(f"{len(failed)} module{'s' if len(failed) > 1 else ''} did not "
                                 f"compile (nvcc's messages above): {', '.join(failed)}")
    return 0


def gpu_arches(text):
    """An argparse type: GPU architectures as nvcc names them, comma-separated (sm_90,sm_80)."""
    arches = [part.strip() for part in text.split(",")]
    if not all(re.fullmatch(GPU_ARCH, arch) for arch in arches):
        raise argparse.ArgumentTypeError(
            f"expected GPU architectures such as sm_90 or sm_80,sm_90, got {text!r}")
    return arches


def gpu_arch(text):
    """An argparse type: one GPU architecture as nvcc names it (sm_90)."""
    if not re.fullmatch(GPU_ARCH, text):
        raise argparse.ArgumentTypeError(f"expected a GPU architecture such as sm_90, got {text!r}")
    return text


def define_pair(text):
    """An argparse type: ``NAME=VALUE`` as a (NAME, VALUE) pair (for nvcc's -D)."""
    name, equals, value = text.partition("=")
    if not equals or not re.fullmatch(r"[A-Za-z_]\w*", name):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def add_build_kernels_parser(sub):
    """The ``build-kernels`` command: fill the kernel cache (no GPU needed with --arch)."""
    build = sub.add_parser("build-kernels", help="compile gdnflow's CUDA modules (or FILEs) into "
                           "the kernel cache ahead of time, e.g. for a container image; needs "
                           "nvcc, and a GPU only to find the architecture when --arch is not "
                           "given")
    build.add_argument("files", nargs="*", metavar="FILE",
                       help="CUDA sources to compile (default: gdnflow's own modules, those "
                       "the first run of a process compiles, with the journaled per-shape "
                       "variants)")
    build.add_argument("--arch", type=gpu_arches,
                       help="GPU architectures to compile for, comma-separated, e.g. sm_90 or "
                       "sm_80,sm_90 (default: this machine's GPU)")
    build.add_argument("-D", "--define", action="append", type=define_pair, default=[],
                       metavar="NAME=VALUE", help="a -D define for the FILEs (repeat for more)")
    build.add_argument("--plugins", action="store_true",
                       help="also compile the installed plugins' CUDA sources")
    build.add_argument("--sm-count", type=positive_int, metavar="N",
                       help="the SM count whose journaled per-shape variants (the kernel "
                       "cache's journal and gdnflow's shipped list) are compiled too (default: "
                       "this machine's GPU's without --arch, else every SM count journaled for "
                       "the architecture)")
    build.add_argument("--cache", metavar="DIR",
                       help=f"the cache folder (default: ${CACHE_VARIABLE}, else "
                       "$XDG_CACHE_HOME/gdnflow/kernels or ~/.cache/gdnflow/kernels)")
    build.add_argument("--workers", type=positive_int,
                       help="nvcc runs at a time (default: the CPU cores, at most 16)")
    build.set_defaults(run=cmd_build_kernels)


def build_parser():
    """The argument parser of the ``gdnflow`` command."""
    parser, sub = command_parser("gdnflow", __doc__.split("\n\n")[0])
    info = sub.add_parser("info", help="show devices, operators and where the CUDA sources are; "
                          "with FILE, what a checkpoint, Keras or ONNX file holds")
    info.add_argument("file", nargs="?", metavar="FILE",
                      help="a gdnflow checkpoint, Keras .h5 or ONNX file to describe")
    info.add_argument("--include", action="store_true", help="print only the folder holding "
                      "gdnflow_common.cuh (nvcc -I\"$(gdnflow info --include)\" my.cu)")
    info.set_defaults(run=cmd_info)
    add_demo_parser(sub)
    add_train_parser(sub)
    listing = sub.add_parser("plugins", help="list installed operator plugins, their operators, "
                             "whether their CUDA sources compile and their kernel argument "
                             "types match (exit 1 if one fails)")
    add_arch_option(listing)
    listing.set_defaults(run=cmd_plugins)
    check = sub.add_parser("plugin-check", help="gradcheck a plugin's operators on the inputs "
                           "they declare (and compare CUDA with NumPy where CUDA is usable)")
    check.add_argument("name", help="an installed plugin, a plugin's .py file or package "
                       "folder, or an operator name")
    check.add_argument("--seed", type=nonnegative_int, default=0, help="random seed of the inputs")
    check.add_argument("--require-gpu", action="store_true", help="exit 1 if the CUDA-against-"
                       "NumPy check cannot run (no CUDA device)")
    add_arch_option(check)
    check.set_defaults(run=cmd_plugin_check)
    add_build_kernels_parser(sub)
    classify.add_commands(sub)
    add_bench_parser(sub)
    add_prune_parser(sub)
    add_codec_parsers(sub)
    return parser


def main(argv=None):
    """Entry point of the ``gdnflow`` console script: the exit status (module docstring)."""
    return run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
