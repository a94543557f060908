"""Choosing the device: by argument, by GDNFLOW_DEVICE, automatically."""
import subprocess
import sys

import pytest

import gdnflow as gf
from gdnflow.errors import BackendUnavailableError


def run_python(code, **env):
    import os
    full_env = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full_env, timeout=120)


def test_environment_variable_chooses_the_default():
    r = run_python("import gdnflow as gf; print(gf.default_device())", GDNFLOW_DEVICE="numpy")
    assert r.returncode == 0 and r.stdout.strip() == "numpy" and "notice" not in r.stderr


def test_bad_environment_value_is_named():
    r = run_python("import gdnflow as gf; gf.default_device()", GDNFLOW_DEVICE="gpu0")
    assert r.returncode != 0 and "unknown device 'gpu0'" in r.stderr


def test_import_works_and_auto_choice_is_explained_without_cuda():
    if gf.cuda_available():
        pytest.skip("a CUDA device is present: the automatic choice is cuda")
    r = run_python("import gdnflow as gf; print(gf.default_device())", GDNFLOW_DEVICE="")
    assert r.returncode == 0 and r.stdout.strip() == "numpy"
    assert len(r.stderr.strip().splitlines()) == 1 and "running on NumPy" in r.stderr


def test_asking_for_cuda_without_it_says_why():
    if gf.cuda_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(BackendUnavailableError, match="no CUDA device is usable"):
        gf.tensor([1.0], device="cuda")


def test_set_default_device():
    previous = gf.default_device()
    try:
        gf.set_default_device("numpy")
        assert gf.tensor([1.0]).device == "numpy"
        with pytest.raises(ValueError):
            gf.set_default_device("metal")
    finally:
        gf.set_default_device(previous)
