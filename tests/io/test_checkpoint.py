"""Checkpoints: round trips (model, optimiser, extra), atomic writes, damaged
and foreign files, and messages for checkpoints that do not fit."""
import json
import os

import h5py
import numpy as np
import pytest

import gdnflow as gf
from gdnflow.io import (CheckpointError, load_checkpoint, read_checkpoint_info,
                        save_checkpoint)
from gdnflow.nn import Module, Parameter
from gdnflow.optim import SGD, Adam


class Dense(Module):
    """y = x w + b, for rows x."""

    def __init__(self, rng, n_in, n_out, device):
        super().__init__()
        self.weight = Parameter(rng.standard_normal((n_in, n_out)) * 0.3, device=device)
        self.bias = Parameter(rng.standard_normal(n_out) * 0.1, device=device)

    def forward(self, x):
        columns = x.reshape(x.shape[0], x.shape[1], 1) * self.weight.reshape(1, *self.weight.shape)
        return columns.sum(axis=1) + self.bias


class Net(Module):
    """Two dense layers (dotted names ``layers.0.weight``...), a name and a config."""

    name = "tiny-net"

    def __init__(self, rng, hidden=5, device="numpy"):
        super().__init__()
        self.config = {"hidden": hidden, "activation": "sigmoid"}
        self.layers = Module()
        setattr(self.layers, "0", Dense(rng, 3, hidden, device))
        setattr(self.layers, "1", Dense(rng, hidden, 2, device))

    def forward(self, x):
        return getattr(self.layers, "1")(getattr(self.layers, "0")(x).sigmoid())


class NetWithBuffers(Net):
    """Net plus a running-mean buffer, found through named_buffers()."""

    def __init__(self, rng, device="numpy"):
        super().__init__(rng, device=device)
        object.__setattr__(self, "running_mean", gf.tensor(rng.standard_normal(2), device=device))

    def named_buffers(self):
        return [("running_mean", self.running_mean)]


def train(model, opt, rng, steps, device="numpy"):
    for _ in range(steps):
        x = gf.tensor(rng.standard_normal((8, 3)), device=device)
        y = gf.tensor(rng.standard_normal((8, 2)), device=device)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()


def params_of(model):
    return {name: p.numpy().copy() for name, p in model.named_parameters()}


def make_adam(model):
    return Adam([{"params": model.parameters()[:2], "lr": 0.02},
                 {"params": model.parameters()[2:]}], lr=0.01, weight_decay=0.01)


# ---------------------------------------------------------- round trip --
def test_round_trip_restores_model_optimizer_and_extra(tmp_path, rng):
    model = Net(np.random.default_rng(1))
    opt = make_adam(model)
    train(model, opt, rng, 3)
    data_rng = np.random.default_rng(7)
    path = tmp_path / "run.h5"
    save_checkpoint(path, model, opt, extra={"step": 3, "rng": data_rng.bit_generator.state})

    fresh = Net(np.random.default_rng(2))
    fresh_opt = make_adam(fresh)
    result = load_checkpoint(path, fresh, fresh_opt)
    for name, value in params_of(model).items():
        np.testing.assert_array_equal(dict(fresh.named_parameters())[name].numpy(), value)
    assert fresh_opt.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
    for index, entry in opt.state_dict()["state"].items():
        for key, value in entry.items():
            np.testing.assert_array_equal(fresh_opt.state_dict()["state"][index][key], value)
    assert result["extra"]["step"] == 3
    assert result["model_name"] == "tiny-net"
    assert result["config"] == {"hidden": 5, "activation": "sigmoid"}
    assert result["format_version"] == 1 and result["gdnflow_version"] == gf.__version__
    # The RNG state comes back as JSON data that restores the generator.
    restored = np.random.default_rng()
    restored.bit_generator.state = result["extra"]["rng"]
    np.testing.assert_array_equal(restored.random(5), data_rng.random(5))

    # Training goes on identically from the original and from the loaded copy.
    train(model, opt, np.random.default_rng(3), 2)
    train(fresh, fresh_opt, np.random.default_rng(3), 2)
    for name, value in params_of(model).items():
        np.testing.assert_array_equal(dict(fresh.named_parameters())[name].numpy(), value)


def test_loading_keeps_parameter_objects_so_the_optimizer_stays_attached(tmp_path, rng):
    model = Net(rng)
    path = tmp_path / "a.h5"
    save_checkpoint(path, model)
    other = Net(np.random.default_rng(5))
    opt = SGD(other.parameters(), lr=0.1)         # built before loading
    objects = other.parameters()
    load_checkpoint(path, other)
    assert all(a is b for a, b in zip(other.parameters(), objects))
    before = params_of(other)
    train(other, opt, rng, 1)
    assert all(not np.array_equal(before[n], p.numpy()) for n, p in other.named_parameters())


def test_model_only_checkpoint_and_reading_without_a_model(tmp_path, rng):
    model = Net(rng)
    path = tmp_path / "m.h5"
    save_checkpoint(path, model)
    result = load_checkpoint(path)
    assert result["optimizer"] is None and result["extra"] == {}
    assert sorted(result["parameters"]) == sorted(dict(model.named_parameters()))
    for name, p in model.named_parameters():
        assert result["parameters"][name].dtype == np.float32
        np.testing.assert_array_equal(result["parameters"][name], p.numpy())
    with pytest.raises(CheckpointError, match="no optimiser state"):
        load_checkpoint(path, Net(rng), SGD(Net(rng).parameters(), lr=0.1))


def test_buffers_are_saved_and_loaded(tmp_path, rng):
    model = NetWithBuffers(rng)
    path = tmp_path / "b.h5"
    save_checkpoint(path, model)
    other = NetWithBuffers(np.random.default_rng(9))
    buffer = other.running_mean
    load_checkpoint(path, other)
    assert other.running_mean is buffer
    np.testing.assert_array_equal(buffer.numpy(), model.running_mean.numpy())
    save_checkpoint(tmp_path / "plain.h5", Net(rng))
    with pytest.raises(CheckpointError, match=r"1 buffer missing \(running_mean\)"):
        load_checkpoint(tmp_path / "plain.h5", other)


@pytest.mark.skipif(not hasattr(Module, "register_buffer"), reason="Module has no buffers yet")
def test_registered_buffers_of_submodules_round_trip(tmp_path, rng):
    def make(seed):
        model = Net(np.random.default_rng(seed))
        getattr(model.layers, "0").register_buffer("running_var", np.random.default_rng(seed).random(5))
        return model
    model = make(1)
    save_checkpoint(tmp_path / "r.h5", model)
    assert read_checkpoint_info(tmp_path / "r.h5")["buffer_shapes"] == {"layers.0.running_var": (5,)}
    other = make(2)
    load_checkpoint(tmp_path / "r.h5", other)
    np.testing.assert_array_equal(getattr(other.layers, "0").running_var.numpy(),
                                  getattr(model.layers, "0").running_var.numpy())


def test_read_checkpoint_info(tmp_path, rng):
    model = Net(rng)
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
    train(model, opt, rng, 1)
    path = tmp_path / "i.h5"
    save_checkpoint(path, model, opt, extra={"step": 1})
    info = read_checkpoint_info(path)
    assert info["model_name"] == "tiny-net"
    assert info["config"] == model.config
    assert info["parameter_count"] == 3 * 5 + 5 + 5 * 2 + 2
    assert info["parameter_shapes"]["layers.0.weight"] == (3, 5)
    assert info["optimizer"] == "SGD" and info["extra"] == {"step": 1}
    assert info["format_version"] == 1 and info["gdnflow_version"] == gf.__version__


def test_large_extra_fits(tmp_path, rng):
    # Larger than HDF5's 64 KiB limit for compact attributes.
    extra = {"order": list(range(50_000))}
    save_checkpoint(tmp_path / "x.h5", Net(rng), extra=extra)
    assert load_checkpoint(tmp_path / "x.h5")["extra"] == extra


# --------------------------------------------------------- float16 weights --
def test_float16_storage_halves_the_weights_and_loads_them_rounded(tmp_path):
    model = NetWithBuffers(np.random.default_rng(2))
    exact, half = tmp_path / "exact.h5", tmp_path / "half.h5"
    save_checkpoint(exact, model)
    save_checkpoint(half, model, extra={"step": 3}, storage_dtype="float16")
    with h5py.File(half) as f:
        assert f["parameters/layers.0.weight"].dtype == np.float16
        assert f["buffers/running_mean"].dtype == np.float32      # buffers stay exact
    assert os.path.getsize(half) < os.path.getsize(exact)
    saved = load_checkpoint(half)           # the raw arrays too, as the model will hold them
    assert saved["parameters"]["layers.0.weight"].dtype == np.float32
    np.testing.assert_array_equal(saved["buffers"]["running_mean"], model.running_mean.numpy())
    loaded = NetWithBuffers(np.random.default_rng(9))
    load_checkpoint(half, loaded)
    for name, p in model.named_parameters():
        got = dict(loaded.named_parameters())[name]
        assert got.dtype == p.dtype == np.float32
        np.testing.assert_array_equal(got.numpy(), p.numpy().astype(np.float16).astype(np.float32))
        assert not np.array_equal(got.numpy(), p.numpy())     # really rounded
    assert read_checkpoint_info(half)["extra"] == {"step": 3}


def test_float16_storage_flushes_tiny_values_to_zero_as_documented(tmp_path):
    model = Net(np.random.default_rng(2))
    model.load_state_dict({**model.state_dict(),
                           "layers.1.bias": np.array([1e-9, 1e-6], np.float32)})
    save_checkpoint(tmp_path / "w.h5", model, storage_dtype="float16")
    bias = load_checkpoint(tmp_path / "w.h5")["parameters"]["layers.1.bias"]
    assert bias[0] == 0 and bias[1] == pytest.approx(1e-6, rel=0.05)


def test_float16_storage_refuses_optimizer_state_and_values_out_of_range(tmp_path):
    model = Net(np.random.default_rng(2))
    with pytest.raises(ValueError, match="weights only"):
        save_checkpoint(tmp_path / "a.h5", model, Adam(model.parameters()), storage_dtype="float16")
    with pytest.raises(ValueError, match="storage_dtype must be 'float16'.*'int8'"):
        save_checkpoint(tmp_path / "a.h5", model, storage_dtype="int8")
    big = Net(np.random.default_rng(2))
    big.load_state_dict({**big.state_dict(), "layers.1.bias": np.array([1e6, 1.0], np.float32)})
    with pytest.raises(ValueError, match=r"layers\.1\.bias .*float16.*1e\+06"):
        save_checkpoint(tmp_path / "b.h5", big, storage_dtype="float16")
    assert not (tmp_path / "a.h5").exists() and not (tmp_path / "b.h5").exists()


# ------------------------------------------------------------ atomicity --
# A write that fails part way, for real: a value HDF5 cannot store (NumPy
# objects) makes h5py raise at that dataset, after the ones before it were
# written, as a full disk would.
def unstorable():
    return np.array([object()], dtype=object)


class NetWithUnstorableBuffer(Net):
    """Net whose buffer HDF5 cannot store: the write fails after the parameters."""

    def named_buffers(self):
        return [("running_mean", unstorable())]


class UnstorableModel:
    """A model whose only parameter HDF5 cannot store: the first dataset fails."""

    def named_parameters(self):
        return [("weight", unstorable())]


def test_failed_write_leaves_previous_checkpoint_intact(tmp_path, rng):
    path = tmp_path / "ckpt.h5"
    model = Net(rng)
    opt = make_adam(model)
    train(model, opt, rng, 1)
    save_checkpoint(path, model, opt, extra={"step": 1})
    old_bytes = path.read_bytes()

    failing = NetWithUnstorableBuffer(rng)
    with pytest.raises(TypeError, match="dtype"):
        save_checkpoint(path, failing, make_adam(failing), extra={"step": 2})
    assert path.read_bytes() == old_bytes
    assert os.listdir(tmp_path) == ["ckpt.h5"]   # no temporary file left
    assert load_checkpoint(path)["extra"] == {"step": 1}


def test_failed_first_write_creates_no_file(tmp_path):
    with pytest.raises(TypeError):
        save_checkpoint(tmp_path / "new.h5", UnstorableModel())
    assert os.listdir(tmp_path) == []


def test_unserialisable_extra_or_config_fails_before_writing(tmp_path, rng):
    path = tmp_path / "c.h5"
    save_checkpoint(path, Net(rng))
    old = path.read_bytes()
    with pytest.raises(TypeError, match="extra is not JSON-serialisable"):
        save_checkpoint(path, Net(rng), extra={"array": np.zeros(2)})
    model = Net(rng)
    model.config = {"bad": object()}
    with pytest.raises(TypeError, match="config is not JSON-serialisable"):
        save_checkpoint(path, model)
    with pytest.raises(TypeError, match="extra must be a dict"):
        save_checkpoint(path, model, extra=[1, 2])
    assert path.read_bytes() == old and os.listdir(tmp_path) == ["c.h5"]


def test_overwriting_replaces_the_file(tmp_path, rng):
    path = tmp_path / "o.h5"
    save_checkpoint(path, Net(rng), extra={"step": 1})
    save_checkpoint(path, Net(rng), extra={"step": 2})
    assert read_checkpoint_info(path)["extra"] == {"step": 2}
    assert os.listdir(tmp_path) == ["o.h5"]


# ------------------------------------------------- damaged, foreign files --
@pytest.fixture
def saved(tmp_path, rng):
    """A valid checkpoint whose size is mostly parameter data."""
    model = Net(rng, hidden=2000)
    path = tmp_path / "good.h5"
    save_checkpoint(path, model, Adam(model.parameters()))
    return path


def assert_clean_error(path, *match, reader=load_checkpoint):
    with pytest.raises(CheckpointError) as error:
        reader(path)
    message = str(error.value)
    assert str(path) in message
    for text in match:
        assert text in message
    # One line naming the file, not a chained h5py traceback.
    assert error.value.__cause__ is None
    assert error.value.__context__ is None or error.value.__suppress_context__


@pytest.mark.parametrize("reader", [load_checkpoint, read_checkpoint_info])
def test_truncated_file(saved, reader):
    data = saved.read_bytes()
    saved.write_bytes(data[:len(data) // 2])
    assert_clean_error(saved, "not a readable gdnflow checkpoint", reader=reader)


def test_corrupted_parameter_data_is_detected(saved):
    data = bytearray(saved.read_bytes())
    with h5py.File(saved, "r") as f:
        offset = f["parameters/layers.0.weight"].id.get_chunk_info(0).byte_offset
    data[offset + 100:offset + 116] = b"\x55" * 16
    saved.write_bytes(bytes(data))
    assert_clean_error(saved, "not a readable gdnflow checkpoint")


@pytest.mark.parametrize("content", [b"", b"not a checkpoint\n" * 10, bytes(range(256)) * 40],
                         ids=["empty", "text", "binary"])
def test_not_hdf5_at_all(tmp_path, content):
    path = tmp_path / "junk.h5"
    path.write_bytes(content)
    assert_clean_error(path, "not a readable gdnflow checkpoint")
    assert_clean_error(path, "not a readable gdnflow checkpoint", reader=read_checkpoint_info)


def test_foreign_hdf5_file(tmp_path):
    path = tmp_path / "keras.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("model_weights/dense/kernel", data=np.zeros((3, 3)))
    assert_clean_error(path, "not a gdnflow checkpoint")


def test_newer_format_version_is_refused(saved):
    with h5py.File(saved, "a") as f:
        f.attrs["format_version"] = 99
    assert_clean_error(saved, "format version 99", "upgrade gdnflow")


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "nowhere.h5")


# ------------------------------------------------------------ mismatch --
class Other(Module):
    """Net's first layer with a wrong shape, its second missing, one more parameter."""

    def __init__(self, rng):
        super().__init__()
        self.layers = Module()
        setattr(self.layers, "0", Dense(rng, 4, 5, "numpy"))
        self.scale = Parameter(np.ones(1), device="numpy")


def test_a_long_mismatch_lists_the_first_names_and_counts_the_rest(tmp_path, rng):
    path = tmp_path / "net.h5"
    save_checkpoint(path, Net(rng))
    wide = Module()
    for i in range(40):
        setattr(wide, f"p{i:02d}", Parameter(np.ones(1), device="numpy"))
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(path, wide)
    message = str(error.value)
    assert "40 parameters missing (p00, p01, p02, ... and 37 more)" in message
    assert "p03" not in message and len(message) < 400 and "\n" not in message


def test_mismatched_model_lists_every_problem_and_changes_nothing(tmp_path, rng):
    path = tmp_path / "net.h5"
    save_checkpoint(path, Net(rng))
    other = Other(rng)
    before = params_of(other)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(path, other)
    message = str(error.value)
    assert str(path) in message and "model Other" in message
    assert "1 parameter missing (scale)" in message
    assert "2 parameters unexpected (layers.1.bias, layers.1.weight)" in message
    assert "1 parameter mis-shaped (layers.0.weight (checkpoint (3, 5), model (4, 5)))" in message
    for name, value in params_of(other).items():
        np.testing.assert_array_equal(value, before[name])


def test_mismatched_optimizer_is_refused_before_the_model_changes(tmp_path, rng):
    model = Net(rng)
    opt = make_adam(model)
    train(model, opt, rng, 1)
    path = tmp_path / "adam.h5"
    save_checkpoint(path, model, opt)
    other = Net(np.random.default_rng(11))
    before = params_of(other)
    with pytest.raises(CheckpointError, match=r"optimiser state does not fit.*not a SGD"):
        load_checkpoint(path, other, SGD(other.parameters(), lr=0.1))
    with pytest.raises(CheckpointError, match=r"groups of \[2, 2\] parameters, this optimiser \[4\]"):
        load_checkpoint(path, other, Adam(other.parameters()))
    for name, value in params_of(other).items():
        np.testing.assert_array_equal(value, before[name])


def test_saved_file_is_plain_hdf5_with_the_documented_layout(tmp_path, rng):
    model = Net(rng)
    opt = make_adam(model)
    train(model, opt, rng, 2)
    path = tmp_path / "layout.h5"
    save_checkpoint(path, model, opt, extra={"step": 2})
    with h5py.File(path, "r") as f:
        assert f.attrs["format"] == "gdnflow-checkpoint" and f.attrs["format_version"] == 1
        assert json.loads(f.attrs["model_config"]) == model.config
        assert sorted(f["parameters"]) == sorted(dict(model.named_parameters()))
        assert f["optimizer"].attrs["type"] == "Adam"
        groups = json.loads(f["optimizer"].attrs["param_groups"])
        assert [g["params"] for g in groups] == [[0, 1], [2, 3]]
        assert f["optimizer/state/3"].attrs["step"] == 2
        assert f["optimizer/state/3/exp_avg"].shape == (2,)


# -------------------------------------------------------------------- GPU --
@pytest.mark.gpu
def test_cuda_checkpoint_loads_on_numpy_and_back(tmp_path, rng):
    model = Net(np.random.default_rng(1), device="cuda")
    opt = make_adam(model)
    train(model, opt, rng, 2, device="cuda")
    path = tmp_path / "gpu.h5"
    save_checkpoint(path, model, opt)
    on_numpy = Net(np.random.default_rng(2))
    numpy_opt = make_adam(on_numpy)
    load_checkpoint(path, on_numpy, numpy_opt)
    for name, value in params_of(model).items():
        np.testing.assert_array_equal(dict(on_numpy.named_parameters())[name].numpy(), value)
    back = Net(np.random.default_rng(3), device="cuda")
    back_opt = make_adam(back)
    save_checkpoint(tmp_path / "cpu.h5", on_numpy, numpy_opt)
    load_checkpoint(tmp_path / "cpu.h5", back, back_opt)
    assert all(p.device == "cuda" for p in back.parameters())
    train(model, opt, np.random.default_rng(4), 2, device="cuda")
    train(back, back_opt, np.random.default_rng(4), 2, device="cuda")
    for name, value in params_of(model).items():
        np.testing.assert_allclose(dict(back.named_parameters())[name].numpy(), value, rtol=1e-6)


def test_a_full_disk_is_one_error_naming_the_checkpoint_and_leaves_nothing(tmp_path):
    # A file-size limit stands in for a full disk: writes past it fail with EFBIG.
    import subprocess
    import sys
    script = f"""
import resource, signal
from gdnflow.io.checkpoint import save_checkpoint
from gdnflow.io.files import OutputError
from gdnflow.models.factorized_prior import FactorizedPrior
model = FactorizedPrior(8, 12, seed=0, device="numpy")
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    save_checkpoint({str(tmp_path / 'model.h5')!r}, model)
except OutputError as exc:
    print("refused:", exc)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout.startswith(f"refused: cannot write {tmp_path / 'model.h5'}: ")
    assert ".tmp" not in result.stdout
    assert list(tmp_path.iterdir()) == []
