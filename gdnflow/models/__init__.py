"""Model definitions, registered by name (``gdnflow.models.get("vgg16")``).

Parameter names follow torchvision's, so its state dicts (converted to NumPy
arrays) load with ``load_state_dict`` unchanged.
"""
from gdnflow.models.factorized_prior import FactorizedPrior, factorized_prior
from gdnflow.models.mobilenet_v2 import mobilenet_v2
from gdnflow.models.scale_hyperprior import ScaleHyperprior, scale_hyperprior
from gdnflow.models.vgg import vgg16

#: Every model's constructor, by the name ``get`` takes.
MODELS = {"mobilenet_v2": mobilenet_v2, "vgg16": vgg16, "factorized_prior": factorized_prior,
          "hyperprior": scale_hyperprior}

#: The image-codec models ``gdnflow train --model`` trains, by their ``name``.
CODEC_MODELS = {"factorized_prior": FactorizedPrior, "hyperprior": ScaleHyperprior}


def get(name):
    """The constructor of the model called ``name``."""
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"no model named {name!r}; known: {sorted(MODELS)}") from None
