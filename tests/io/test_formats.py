"""gdnflow.io.formats: model files told apart by content; a wrong kind named with its fix."""
import pytest

from gdnflow.io.checkpoint import save_checkpoint
from gdnflow.io.files import InputError
from gdnflow.io.formats import (CHECKPOINT, KERAS, ONNX, FileKindError, detect_format,
                                require_checkpoint)
from gdnflow.models.factorized_prior import FactorizedPrior


def test_each_kind_is_recognised_by_content(tmp_path):
    checkpoint = tmp_path / "model.bin"             # suffixes do not decide
    save_checkpoint(checkpoint, FactorizedPrior(8, 12, seed=0, device="numpy"))
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "keras.h5", "w") as f:
        f.attrs["keras_version"] = "3"
    (tmp_path / "graph.bin").write_bytes(b"\x08\x07rest of a ModelProto")
    (tmp_path / "notes.txt").write_text("hello")
    assert detect_format(checkpoint) == CHECKPOINT
    assert detect_format(tmp_path / "keras.h5") == KERAS
    assert detect_format(tmp_path / "graph.bin") == ONNX
    assert detect_format(tmp_path / "notes.txt") is None
    assert require_checkpoint(checkpoint, "gdnflow prune") == checkpoint


def test_a_wrong_kind_says_what_it_is_and_how_to_convert_it(tmp_path):
    (tmp_path / "m.onnx").write_bytes(b"\x08\x07graph")
    with pytest.raises(FileKindError, match=r"m.onnx is an ONNX file; gdnflow prune expects a "
                       r"gdnflow checkpoint: make one with gdnflow convert .*m.onnx OUT.h5"):
        require_checkpoint(tmp_path / "m.onnx", "gdnflow prune")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(FileKindError, match="notes.txt is not a gdnflow checkpoint"):
        require_checkpoint(tmp_path / "notes.txt", "gdnflow compress")
    with pytest.raises(InputError, match="is a folder"):
        require_checkpoint(tmp_path, "gdnflow compress")
