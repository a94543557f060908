"""gdnflow: train and run GDN image codecs, run CNNs imported from ONNX or Keras, and
check operator plugins.

    gdnflow info              what gdnflow sees: version, devices, operators, CUDA sources
    gdnflow info --include    the folder of gdnflow_common.cuh, for nvcc -I
    gdnflow info FILE         what a checkpoint, Keras or ONNX file holds
    gdnflow classify IMAGE... top-5 classes of images (gdnflow.classify)
    gdnflow convert IN OUT.h5 an ONNX or Keras file as a gdnflow checkpoint
    gdnflow train             train a GDN image-compression autoencoder (--resume continues a run)
    gdnflow bench             MobileNetV2 and VGG16 inference: gdnflow against PyTorch
    gdnflow compress IMAGE... compress images to .gdn files with a codec checkpoint (gdnflow.codec)
    gdnflow decompress FILE.. decode .gdn files to images (finds the checkpoint by model id)
    gdnflow eval              codec checkpoints against JPEG on a folder: table, JSON, RD plot
    gdnflow prune MODEL.h5    magnitude pruning of a checkpoint's convolutions (gdnflow.sparse)
    gdnflow plugins           installed operator plugins: loaded? operators? does the CUDA compile?
    gdnflow plugin-check NAME gradient (and CUDA-against-NumPy) check of a plugin's operators

Errors are one line ``gdnflow CMD: message`` on stderr; the exit status is 0,
1 on a failure, 2 on a usage error (a bad option or value), 130 on Ctrl-C and
141 on a closed pipe; ``gdnflow --debug CMD`` (or ``GDNFLOW_DEBUG=1``) shows
tracebacks (:mod:`gdnflow.commandline`).
"""
import sys

from gdnflow import classify, plugins, registry
from gdnflow.backends import cuda, default_device
from gdnflow.backends.cuda.sources import source_dir
from gdnflow.codec.cli import add_codec_parsers
from gdnflow.commandline import command_parser, nonnegative_int, run
from gdnflow.errors import BackendUnavailableError, KernelCompileError
from gdnflow.inference_bench import add_bench_parser
from gdnflow.sparse import describe as describe_sparse
from gdnflow.sparse.cli import add_prune_parser
from gdnflow.train.cli import add_train_parser
from gdnflow.version import __version__


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
        ok = print_kernel_check(plugin, args.arch) and ok
    return 0 if ok else 1


def print_kernel_check(plugin, arch):
    """Compile a plugin's sources and check its kernel declarations, printing what happened.

    Returns False if a source does not compile or a declaration disagrees
    with its kernel; True also when nvcc is missing (said as NOT RUN).
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
        return True
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
    kernels_ok = True
    for plugin in owners.values():
        print(f"{plugin.label}:")
        kernels_ok = print_kernel_check(plugin, args.arch) and kernels_ok
    gpu = plugins.cuda_available()
    summary = (f"{len(operators) - failed} of {len(operators)} operators passed"
               + ("" if kernels_ok else "; kernels FAILED")
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
    parser.add_argument("--arch", metavar="SM", help="nvcc target of the compile check, e.g. "
                        f"sm_80 (default: this machine's GPU, else {plugins.DEFAULT_ARCH})")


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
