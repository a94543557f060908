"""Models and images of the codec tests: small models with non-trivial entropy
models (factorized prior and scale hyperprior), photo-like images, and rANS lanes
of random tables."""
import numpy as np

from gdnflow.codec.rans import Lanes, RansTables
from gdnflow.models import ScaleHyperprior
from gdnflow.models.factorized_prior import FactorizedPrior


def trained_entropy_bottleneck(state, rng):
    """``state`` (a state dict) with its entropy bottleneck as training leaves one: the
    density's parameters moved off their initialisation, the quantiles asymmetric
    around non-zero medians."""
    for name, value in state.items():
        if ".matrices." in name:
            state[name] = value + rng.normal(0, 0.3, value.shape)
        elif ".factors." in name:
            state[name] = rng.normal(0, 1.0, value.shape)
    channels = state["entropy_bottleneck.quantiles"].shape[0]
    medians = rng.uniform(-0.6, 0.6, channels)
    state["entropy_bottleneck.quantiles"] = np.stack(
        [medians - rng.uniform(1.5, 5, channels), medians, medians + rng.uniform(1.5, 5, channels)],
        axis=1)[:, None, :]
    return state


def make_model(seed=0, latent_scale=30.0):
    """A FactorizedPrior(8, 12) on NumPy whose entropy model is not the initial one.

    The density's parameters are moved off their initialisation and the
    quantiles set to asymmetric values around non-zero medians (as training
    leaves them), and g_a's last convolution is scaled so that the latents
    span several integers, some beyond the supports (escapes).
    """
    rng = np.random.default_rng(seed)
    model = FactorizedPrior(8, 12, seed=seed, device="numpy")
    state = trained_entropy_bottleneck(model.state_dict(), rng)
    state["g_a.6.weight"] = state["g_a.6.weight"] * latent_scale
    model.load_state_dict(state)
    return model.eval()


def smooth_image(rng, height, width):
    """A uint8 (H, W, 3) image: smooth colour fields plus a little noise (photo-like)."""
    from PIL import Image
    coarse = rng.integers(0, 256, (height // 8 + 2, width // 8 + 2, 3), dtype=np.uint8)
    image = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BILINEAR), np.int16)
    return np.clip(image + rng.integers(-6, 7, image.shape), 0, 255).astype(np.uint8)


def make_hyperprior(seed=0, device="numpy", scale_bias=(-0.5, 2.0)):
    """A ScaleHyperprior(8, 12) whose latents span several integers (some escape), whose
    z density is not the initial one, and whose scales cover much of the table.

    ``scale_bias``: the range of h_s's last biases; the default leaves many latents
    beyond their tables' supports (escapes), (2, 6) almost none."""
    rng = np.random.default_rng(seed)
    model = ScaleHyperprior(8, 12, seed=seed, device="numpy")
    state = trained_entropy_bottleneck(model.state_dict(), rng)
    state["g_a.6.weight"] = state["g_a.6.weight"] * 30
    state["h_a.0.weight"] = state["h_a.0.weight"] * 4
    state["h_s.4.weight"] = state["h_s.4.weight"] * 8
    state["h_s.4.bias"] = rng.uniform(*scale_bias, 12)
    model.load_state_dict(state)
    return model.to(device).eval()


def widest_hyperprior():
    """ScaleHyperprior(192, 320) (qualities 6-8) with every h_s weight at its layer's largest
    magnitude and random signs: the exact hyper-synthesis's sums reach their 2^52 bound."""
    model = ScaleHyperprior(192, 320, seed=0, device="numpy")
    rng = np.random.default_rng(1)
    state = model.state_dict()
    for name in ("h_s.0.weight", "h_s.2.weight", "h_s.4.weight"):
        state[name] = rng.choice([-0.9999, 0.9999], state[name].shape).astype(np.float32)
    model.load_state_dict(state)
    return model


def random_tables(rng, count=5):
    """Tables of 16-bit frequencies like the codec's: peaked, a long thin tail, each >= 1."""
    cdfs, lows = [], []
    for _ in range(count):
        size = int(rng.integers(2, 40))
        peak = rng.uniform(0.3, 3.0)
        masses = np.exp(-np.abs(np.arange(size) - size // 2) / peak) + 1e-4
        frequencies = np.floor(masses / masses.sum() * (65536 - size)).astype(np.int64) + 1
        frequencies[size // 2] += 65536 - frequencies.sum()
        cdfs.append(np.concatenate([[0], np.cumsum(frequencies)]))
        lows.append(-(size // 2) + int(rng.integers(-1, 2)))
    return RansTables.of(cdfs, lows, 16), cdfs


def random_case(rng, lanes=6, size=3000):
    """(lanes, tables, cdfs, latents): contiguous and gathered runs, an empty lane, lanes of
    very different lengths, values beyond the supports (escapes)."""
    tables, cdfs = random_tables(rng)
    latents = np.round(rng.laplace(0, 3, size)).astype(np.int32)
    positions = size - 400 + rng.permutation(400)      # the gathered run's, in any order
    lane_runs, start = [], 0
    for lane in range(lanes):
        runs = []
        if lane == 1:
            runs.append((int(rng.integers(0, len(cdfs))), 400, -1))     # gathered
        for _ in range(lane % 3 + (lane != 2)):
            count = int(rng.integers(1, 200)) * (lane + 1)
            if start + count > size - 400:
                break
            runs.append((int(rng.integers(0, len(cdfs))), count, start))
            start += count
        lane_runs.append(runs if lane != 3 else [])                     # lane 3: empty
    return Lanes.of(lane_runs, positions), tables, cdfs, latents
