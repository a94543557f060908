"""Import Keras models and weights (HDF5 files) as gdnflow modules::

    model = gdnflow.io.keras.load("model.h5", device="cuda")     # NCHW in, as every gdnflow model
    probabilities = model(gdnflow.tensor(images_nchw, device="cuda"))

Three kinds of file are read, with h5py alone (no TensorFlow or Keras):

- **Full-model files**, ``model.save("x.h5")`` in Keras 2 or 3: a root
  attribute ``model_config`` (the architecture, JSON) and the weights under
  ``/model_weights``. :func:`load` builds a :class:`KerasModel` that runs the
  graph (Functional or Sequential, nested models, shared layers).
- **Legacy weights-only files**, the layout of the ``keras.applications``
  downloads (``model.save_weights("x.h5")`` in Keras 2): root attribute
  ``layer_names``, one group per layer with a ``weight_names`` attribute. They
  hold no architecture, so :func:`load` recognises MobileNetV2 and VGG16 by
  their layer names and builds gdnflow's own model
  (:mod:`gdnflow.io.keras.applications`); :func:`load_weights` loads such a
  file into a model you built.
- **Keras 3 weights files** (``model.save_weights("x.weights.h5")``: groups
  ``/layers/<class>/vars/<i>``, the layer's name in an attribute) are read
  the same way as legacy weights-only files.

Layers supported in full-model files: InputLayer; Conv2D, DepthwiseConv2D,
SeparableConv2D, Conv1D, Dense; BatchNormalization, LayerNormalization;
ReLU, LeakyReLU, PReLU, ELU, Activation, Softmax; SimpleRNN, LSTM, GRU,
Bidirectional (of those); Add, Subtract, Multiply, Average, Maximum,
Minimum, Concatenate; ZeroPadding2D, Cropping2D, UpSampling2D (nearest,
bilinear); MaxPooling2D, AveragePooling2D, MaxPooling1D,
AveragePooling1D, GlobalAveragePooling2D/1D, GlobalMaxPooling2D/1D;
Flatten, Reshape, Permute, Dropout, Rescaling (scalar), and nested
Functional/Sequential models. Activations: those of
:data:`gdnflow.io.keras.activations.ACTIVATIONS` (linear, relu, relu6,
sigmoid, tanh, softmax, elu, selu, gelu, swish/silu, hard_sigmoid,
hard_swish/hard_silu, leaky_relu, softplus, softsign, exponential, mish).
:func:`load` checks every layer first and reports all unsupported layer
types (by class and layer name) and features (``channels_first``, other
activations, ``return_state``...) in one :class:`KerasImportError`,
before anything runs.

**Layout.** A :class:`KerasModel` takes and returns 4-D tensors as NCHW
(transpose NHWC images with ``x.transpose(0, 3, 1, 2)``); kernels are
converted to NCHW once, at import (:mod:`gdnflow.io.keras.weights`), and the
layers keep Keras' results in that layout (:mod:`gdnflow.io.keras.layout`,
which also states TensorFlow's "same" padding). Sequences stay [batch,
time, features], as in Keras.

The package's modules, lowest first: ``file`` (opening a file, its kind),
``graph`` (the model configuration), ``weights`` (reading and converting
weights), ``layout`` (NHWC and NCHW, "same" padding), ``activations``
(Keras activations by name), ``layers_parametric`` and
``layers_recurrent`` (gdnflow modules for the layers with weights),
``layers`` (the parameterless ones, and :data:`LAYERS`, the table of all),
``model`` (:class:`KerasModel`), ``applications`` (keras.applications
weight files), ``loading`` (the entry points below).
"""
from gdnflow.io.keras.applications import MOBILENET_V2_ALPHAS
from gdnflow.io.keras.file import KerasImportError
from gdnflow.io.keras.layers import LAYERS, KerasFunction
from gdnflow.io.keras.layers_parametric import KerasBatchNorm, KerasConv2d, KerasDense
from gdnflow.io.keras.loading import file_info, load, load_weights, model_from_config
from gdnflow.io.keras.model import KerasModel

__all__ = ["load", "load_weights", "model_from_config", "file_info", "KerasModel",
           "KerasImportError", "LAYERS", "MOBILENET_V2_ALPHAS", "KerasConv2d", "KerasDense",
           "KerasBatchNorm", "KerasFunction"]
