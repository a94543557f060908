"""MobileNetV2 and VGG16: architecture (names, shapes, parameter counts as
torchvision's) and, where PyTorch is installed, outputs equal to
torchvision's for the same weights."""
import numpy as np
import pytest

import gdnflow as gf
from gdnflow import models


def test_mobilenet_v2_matches_torchvisions_layout():
    model = models.mobilenet_v2(device="numpy")
    assert sum(p.size for p in model.parameters()) == 3_504_872    # torchvision's count
    state = model.state_dict()
    assert state["features.1.conv.0.0.weight"].shape == (32, 1, 3, 3)   # depthwise
    assert state["features.2.conv.0.0.weight"].shape == (96, 16, 1, 1)  # expand
    assert state["features.18.0.weight"].shape == (1280, 320, 1, 1)
    assert state["classifier.1.weight"].shape == (1000, 1280)
    assert "features.5.conv.3.running_var" in state


def test_vgg16_matches_torchvisions_layout():
    model = models.vgg16(device="numpy")
    assert sum(p.size for p in model.parameters()) == 138_357_544
    names = list(model.state_dict())
    assert names[:2] == ["features.0.weight", "features.0.bias"]
    assert names[-2:] == ["classifier.6.weight", "classifier.6.bias"]


def test_mobilenet_v2_forward_shape_and_width(rng):
    model = models.mobilenet_v2(num_classes=10, width_mult=0.5, device="numpy").eval()
    with gf.no_grad():
        y = model(gf.tensor(rng.standard_normal((2, 3, 64, 64)), device="numpy"))
    assert y.shape == (2, 10) and np.all(np.isfinite(y.numpy()))


def test_unknown_model_name():
    with pytest.raises(KeyError, match="no model named 'resnet'"):
        models.get("resnet")


def load_torchvision(name):
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    reference = getattr(torchvision.models, name)(weights=None).eval()
    # Non-trivial BatchNorm statistics, so that eval mode is really tested.
    with torch.no_grad():
        for module in reference.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.1, 0.1)
    state = {k: v.numpy() for k, v in reference.state_dict().items()
             if not k.endswith("num_batches_tracked")}
    return torch, reference, state


@pytest.mark.gpu
@pytest.mark.parametrize("name,batch", [("mobilenet_v2", 1), ("mobilenet_v2", 3), ("vgg16", 2)])
def test_outputs_equal_torchvisions(name, batch, rng):
    torch, reference, state = load_torchvision(name)
    x = rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)
    with torch.no_grad():
        expected = reference(torch.from_numpy(x)).numpy()
    model = models.get(name)(device="cuda").eval()
    model.load_state_dict(state)
    with gf.no_grad():
        got = model(gf.tensor(x, device="cuda")).numpy()
    assert np.max(np.abs(got - expected)) <= 1e-4 * np.max(np.abs(expected))
