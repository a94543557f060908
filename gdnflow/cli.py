"""The ``gdnflow`` command.

    gdnflow info        what gdnflow sees: version, devices, operators, CUDA sources
    gdnflow demo        the main job (see gdnflow.demo): trains on the default device
"""
import argparse
import sys


def cmd_info(args):
    """Print the version, the devices and the registered operators."""
    import gdnflow
    from gdnflow import registry
    from gdnflow.backends import cuda
    from gdnflow.backends.cuda.sources import source_dir
    print(f"gdnflow {gdnflow.__version__}")
    if cuda.is_available():
        from gdnflow.backends.cuda.runtime import get_runtime
        runtime = get_runtime()
        print(f"cuda: {runtime.name} ({runtime.arch}, {runtime.sm_count} SMs)")
    else:
        print(f"cuda: unavailable ({cuda.unavailable_reason()})")
    print(f"default device: {gdnflow.default_device()}")
    print(f"CUDA sources: {source_dir()}")
    print("operators: " + " ".join(registry.names()))
    return 0


def cmd_demo(args):
    """Run the main job."""
    from gdnflow import demo
    return demo.main(steps=args.steps, device=args.device, seed=args.seed)


def build_parser():
    """The argument parser of the ``gdnflow`` command."""
    parser = argparse.ArgumentParser(prog="gdnflow", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="show devices, operators and where the CUDA sources are"
                   ).set_defaults(run=cmd_info)
    demo = sub.add_parser("demo", help="the main job: train on the default device")
    demo.add_argument("--steps", type=int, default=200, help="optimisation steps (default 200)")
    demo.add_argument("--device", choices=["numpy", "cuda"], help="default: GDNFLOW_DEVICE, "
                      "else cuda when usable, else numpy")
    demo.add_argument("--seed", type=int, default=0, help="random seed")
    demo.set_defaults(run=cmd_demo)
    return parser


def main(argv=None):
    """Entry point of the ``gdnflow`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
