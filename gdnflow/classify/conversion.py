"""``gdnflow convert IN OUT.h5``: an ONNX or Keras file as a gdnflow checkpoint whose config
says how to rebuild the model, so ``gdnflow classify --weights OUT.h5`` needs nothing else.

- Keras applications weights -> gdnflow's ``mobilenet_v2`` (Keras padding
  and epsilon, see :mod:`gdnflow.models.mobilenet_v2`) or ``vgg16``, the
  config as those models write it;
- a Keras full model -> config ``{"name": "keras", "model_config": <Keras'
  JSON>}``, parameters by Keras layer name (``Conv1.weight``), NCHW;
- an ONNX model -> the config of :mod:`gdnflow.classify.onnx_config`: the
  graph in the config, its weights (once) as the checkpoint's parameters.
  Rebuilding needs the ``onnx`` package, as reading the ONNX file did.

Each config also records ``preprocess``, the input scaling its weights
expect (:mod:`gdnflow.classify.preprocess`), which ``classify`` uses unless
told otherwise.
"""
from gdnflow.classify.errors import ClassifyError
from gdnflow.classify.loading import detect_format, load_file
from gdnflow.classify.onnx_config import onnx_config
from gdnflow.io.checkpoint import save_checkpoint


def convert(source, destination):
    """Write the model in ``source`` (ONNX or Keras) as a gdnflow checkpoint at ``destination``.

    Returns (model name, parameter count). See the module docstring for what
    the checkpoint's config holds.
    """
    kind = detect_format(source)
    if kind == "gdnflow-checkpoint":
        raise ClassifyError(f"{source} is already a gdnflow checkpoint")
    network = load_file(source, "numpy")
    if kind == "onnx":
        network.config = onnx_config(network, source)
    save_checkpoint(destination, network)
    name = network.config.get("name")
    return name, int(sum(p.size for p in network.parameters()))
