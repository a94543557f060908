"""gdnflow.io.files: outputs checked before the work, atomic writes, errors naming the user's path."""
import os

import pytest

from gdnflow.io.files import (InputError, OutputError, OutputExistsError, atomic_output,
                              check_folder, check_inputs, check_outputs, output_paths,
                              remove_stale_temporaries, write_bytes_atomic)


def test_existing_outputs_are_refused_unless_forced(tmp_path):
    kept = tmp_path / "a.gdn"
    kept.write_bytes(b"user data")
    with pytest.raises(OutputExistsError, match="a.gdn exists: pass --force"):
        check_outputs([kept, tmp_path / "b.gdn"])
    assert check_outputs([kept], force=True) == [kept]
    assert kept.read_bytes() == b"user data"


def test_an_input_is_never_an_output_even_forced(tmp_path):
    source = tmp_path / "model.h5"
    source.write_bytes(b"weights")
    link = tmp_path / "alias.h5"
    os.symlink(source, link)
    for output in (source, link, tmp_path / "sub" / ".." / "model.h5"):
        with pytest.raises(OutputError, match="is also an input"):
            check_outputs([output], inputs=[source], force=True)
    assert source.read_bytes() == b"weights"


def test_unwritable_destinations_fail_before_the_work_naming_the_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OutputError, match=f"{blocker} exists and is not a folder"):
        check_outputs([blocker / "out.png"])
    with pytest.raises(OutputError, match="is a folder"):
        check_outputs([tmp_path])
    if os.geteuid() != 0:           # root writes in read-only folders
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(OutputError, match=f"cannot write in {locked}"):
            check_folder(locked)


def test_check_creates_the_folder_and_leaves_no_probe(tmp_path):
    target = tmp_path / "new" / "deeper" / "out.gdn"
    check_outputs([target])
    assert target.parent.is_dir() and not any(target.parent.iterdir())


def test_atomic_output_keeps_the_old_file_on_error(tmp_path):
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_output(path, overwrite=True) as temporary:
            temporary.write_bytes(b"half")
            raise RuntimeError("crash mid-write")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]
    write_bytes_atomic(path, b"new", overwrite=True)
    assert path.read_bytes() == b"new"
    with pytest.raises(OutputExistsError):
        write_bytes_atomic(path, b"newer")


def test_a_failed_rename_names_the_users_path(tmp_path):
    target = tmp_path / "out.bin"
    target.mkdir()                  # os.replace of a file over a folder fails
    with pytest.raises(OutputError, match=f"cannot write {target}") as caught:
        write_bytes_atomic(target, b"data", overwrite=True)
    assert ".tmp" not in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_output_paths_refuse_two_inputs_on_one_output(tmp_path):
    assert output_paths(["a/x.png"], None, ".gdn")[0].name == "x.gdn"
    with pytest.raises(OutputError, match="would both be written"):
        output_paths(["a/x.png", "b/x.jpg"], tmp_path, ".gdn")
    with pytest.raises(OutputError, match="would both be written"):     # one file, two names
        output_paths([tmp_path / "x.png", tmp_path / "sub" / ".." / "x.bmp"], None, ".gdn")


def test_stale_temporaries_are_removed_by_name(tmp_path):
    for name in (".checkpoint.h5.0123456789ab.tmp", ".other.h5.0123456789ab.tmp", "keep.h5"):
        (tmp_path / name).write_text("x")
    removed = remove_stale_temporaries(tmp_path, names={"checkpoint.h5"})
    assert [p.name for p in removed] == [".checkpoint.h5.0123456789ab.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.h5.0123456789ab.tmp", "keep.h5"]


def test_inputs_that_cannot_be_read_are_named(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "good.png").write_bytes(b"pixels")
    cases = {"folder": "folder is a folder, not an image",
             "missing.png": "missing.png: no such file",
             "empty.onnx": r"empty.onnx is empty \(0 bytes\), not an image"}
    for name, message in cases.items():
        with pytest.raises(InputError, match=message):
            check_inputs([tmp_path / "good.png", tmp_path / name], "image")
    assert check_inputs([str(tmp_path / "good.png")]) == [tmp_path / "good.png"]
