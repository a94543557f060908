"""An imported ONNX graph inside a gdnflow checkpoint's config, and back.

The config is ``{"name": "onnx", "preprocess": "torchvision", "onnx_model":
<base64 of the ONNX model with the parameters' data removed>, "parameters":
{ONNX initializer: gdnflow parameter}}``: the graph travels in the config,
its weights (once) as the checkpoint's parameters. Both directions need the
``onnx`` package, as reading the ONNX file did.
"""
import base64

import numpy as np

from gdnflow.classify.errors import ClassifyError
from gdnflow.io.onnx import OnnxModule


def onnx_config(module, path):
    """The config storing ``module`` (imported from the ONNX file ``path``) without its weights."""
    import onnx     # local import: onnx is optional, loaded on first use
    model = onnx.load(str(path))
    parameters = dict(module._parameter_of)     # ONNX initializer -> gdnflow parameter
    for tensor in model.graph.initializer:
        if tensor.name in parameters:
            # The values live in the checkpoint's parameters; keep name, type and dims.
            for field in ("raw_data", "float_data", "double_data", "int32_data"):
                tensor.ClearField(field)
    return {"name": "onnx", "preprocess": "torchvision",
            "onnx_model": base64.b64encode(model.SerializeToString()).decode("ascii"),
            "parameters": parameters}


def onnx_from_config(path, config, parameters, device):
    """The :class:`~gdnflow.io.onnx.OnnxModule` a checkpoint's ``config`` and ``parameters`` hold.

    Raises :class:`ClassifyError` naming ``path`` when the onnx package is missing.
    """
    try:
        import onnx     # local import: onnx is optional, loaded on first use
        from onnx import helper, numpy_helper   # local import: onnx is optional
    except ImportError:
        raise ClassifyError(f"{path} holds an ONNX graph: reading it needs the onnx package "
                            "(pip install onnx)") from None
    model = onnx.load_from_string(base64.b64decode(config["onnx_model"]))
    for tensor in model.graph.initializer:
        attribute = config["parameters"].get(tensor.name)
        if attribute is not None:
            dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
            array = np.asarray(parameters[attribute], dtype=dtype).reshape(tuple(tensor.dims))
            tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))
    network = OnnxModule(model, device=device, source=str(path))
    network.config = dict(config)
    network.image_size = onnx_image_size(model)
    return network


def onnx_image_size(model):
    """(H, W) of an ONNX model's first input when static and NCHW-shaped, else None."""
    initializers = {t.name for t in model.graph.initializer}
    for value in model.graph.input:
        if value.name not in initializers:
            dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
            return tuple(dims[2:]) if len(dims) == 4 and all(dims[2:]) else None
    return None
