"""Operator plugins: loading from paths and entry points, failures, nvcc checks, the CLI."""
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import gdnflow
from gdnflow import cli, plugins, registry
from gdnflow.backends.cuda import sources
from gdnflow.backends.cuda.kernel_cache import KernelCache
from gdnflow.backends.cuda.sources import InlineSource, compile_error_message, expand_source
from gdnflow.backends.cuda import kernel_arguments
from gdnflow.errors import BackendUnavailableError, KernelArgumentError, KernelCompileError
from gdnflow.ops.elementwise import ReLUOp

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")

# y = x^3. FACTOR 3 is the right derivative; the tests write 2 to get a wrong one.
CUBE = '''
from gdnflow import plugins

@plugins.register("{name}")
class Cube(plugins.Operator):
    """y = x^3."""
    example_inputs = {{"x": (2, 3)}}

    def forward_numpy(self, x):
        self.save(x=x)
        return x ** 3

    def backward(self, gy):
        x = self.saved.x
        return (gy * self.wrap({factor} * x ** 2),)
'''

GOOD_CU = '''// a plugin kernel using gdnflow's common header
#include "gdnflow_common.cuh"

extern "C" __global__ void cube_forward(const float* x, float* y, int n) {
    GRID_STRIDE_LOOP(i, n) { y[i] = x[i] * x[i] * x[i]; }
}
'''


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def cube_file(folder, name, factor=3):
    return write(folder / f"{name}.py", CUBE.format(name=name, factor=factor))


def fake_distribution(site, dist, entry_points, modules):
    """An installed distribution as importlib.metadata sees one: a .dist-info on sys.path."""
    info = site / f"{dist}-0.1.dist-info"
    write(info / "METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    write(info / "entry_points.txt", "[gdnflow.operators]\n" + "".join(
        f"{name} = {module}\n" for name, module in entry_points.items()))
    for relative, text in modules.items():
        write(site / relative, text)
    return site


@pytest.fixture(autouse=True)
def isolated():
    """Each test starts with no plugin recorded, and leaves no operator of its own behind."""
    operators = dict(registry._operators)
    modules = set(sys.modules)
    with plugins.fresh_records():
        yield
    # Forget the test's plugins: their operators and modules together (an
    # installed plugin the test imported stays, registered, as in real use).
    ours = ("gdnflow_plugin_", "tp_", "gdnflow_swish")
    for name in set(registry.names()) - set(operators):
        if registry.get(name).__module__.startswith(ours):
            registry.unregister(name)
    registry._operators.update(operators)
    for name in set(sys.modules) - modules:
        if name.startswith(ours):
            del sys.modules[name]


# ----------------------------------------------------------- load(path) --
def test_load_a_file_registers_its_operator(tmp_path):
    record = plugins.load(cube_file(tmp_path, "tp_cube"))
    assert record.loaded and record.name == "tp_cube"
    assert record.operators() == ["tp_cube"]
    assert registry.get("tp_cube").__name__ == "Cube"
    assert plugins.check_operator(registry.get("tp_cube"))[0].startswith(
        "gradcheck (numpy, float64): passed on x (2, 3)")
    # Loading again returns the same record, not a clash with itself.
    assert plugins.load(tmp_path / "tp_cube.py") is record


def test_files_of_one_name_in_two_folders_do_not_collide(tmp_path):
    write(tmp_path / "a" / "op.py", CUBE.format(name="tp_a", factor=3))
    write(tmp_path / "b" / "op.py", CUBE.format(name="tp_b", factor=3))
    first, second = plugins.load(tmp_path / "a" / "op.py"), plugins.load(tmp_path / "b" / "op.py")
    assert first.module != second.module
    assert (first.operators(), second.operators()) == (["tp_a"], ["tp_b"])


def test_load_a_package_with_its_kernel(tmp_path):
    package = tmp_path / "tp_pkg"
    write(package / "__init__.py", "from tp_pkg.ops import Cube  # its own name works\n")
    write(package / "ops.py", CUBE.format(name="tp_pkg_cube", factor=3)
          + 'SOURCE = plugins.source_file(__file__, "cube.cu")\n')
    cu = write(package / "kernels" / "cube.cu", GOOD_CU)
    (package / "cube.cu").write_text(GOOD_CU)
    record = plugins.load(package)
    assert record.loaded and record.operators() == ["tp_pkg_cube"]
    assert record.sources() == [package / "cube.cu", cu]
    assert sys.modules["tp_pkg"].ops.SOURCE == package / "cube.cu"
    assert plugins.owner_of(cu) == "plugin 'tp_pkg' (module tp_pkg)"
    assert plugins.owner_of(tmp_path / "elsewhere.cu") is None


def test_a_missing_kernel_file_fails_the_load(tmp_path):
    path = write(tmp_path / "tp_nocu.py", CUBE.format(name="tp_nocu", factor=3)
                 + 'SOURCE = plugins.source_file(__file__, "nocu.cu")\n')
    with pytest.raises(plugins.PluginError, match=r"plugin 'tp_nocu'.*nocu\.cu not found"):
        plugins.load(path)
    # What it registered before failing is undone.
    assert "tp_nocu" not in registry.names()


def test_load_refuses_what_is_no_plugin(tmp_path):
    with pytest.raises(plugins.PluginError, match="give a .py file or a package folder"):
        plugins.load(write(tmp_path / "notes.txt", "hello"))
    with pytest.raises(plugins.PluginError, match="give a .py file or a package folder"):
        plugins.load(tmp_path)      # a folder without __init__.py


def test_a_clash_with_a_builtin_names_the_plugin_and_the_builtin(tmp_path):
    path = write(tmp_path / "tp_clash.py", CUBE.format(name="relu", factor=3))
    with pytest.raises(plugins.PluginError) as caught:
        plugins.load(path)
    message = str(caught.value)
    assert "plugin 'tp_clash'" in message and str(path) in message
    assert "operator name 'relu' is taken by gdnflow.ops.elementwise.ReLU" in message
    assert registry.get("relu") is ReLUOp


# ---------------------------------------------------------- entry points --
def test_installed_plugins_are_found_by_entry_point(tmp_path, monkeypatch):
    site = fake_distribution(tmp_path, "tp-found", {"tp_found": "tp_found"},
                             {"tp_found.py": CUBE.format(name="tp_found_cube", factor=3)})
    monkeypatch.syspath_prepend(str(site))
    # Asking the registry for an unknown name loads the installed plugins.
    assert registry.get("tp_found_cube").__module__ == "tp_found"
    (record,) = [p for p in plugins.loaded() if p.name == "tp_found"]
    assert record.loaded and record.origin == "tp-found 0.1"
    assert record.operators() == ["tp_found_cube"]
    assert plugins.load_installed().count(record) == 1      # imported once


def test_broken_plugins_are_recorded_and_break_nothing(tmp_path, monkeypatch, capsys):
    site = fake_distribution(
        tmp_path, "tp-broken", {"tp_broken": "tp_broken", "tp_clashes": "tp_clashes"},
        {"tp_broken.py": CUBE.format(name="tp_half", factor=3) + "import does_not_exist_xyz\n",
         "tp_clashes.py": CUBE.format(name="relu", factor=3)})
    monkeypatch.syspath_prepend(str(site))
    records = {p.name: p for p in plugins.load_installed()}
    broken, clashes = records["tp_broken"], records["tp_clashes"]
    assert not broken.loaded
    assert broken.error.startswith("ModuleNotFoundError: No module named 'does_not_exist_xyz'")
    assert broken.error.endswith(f"tp_broken.py:{CUBE.count(chr(10)) + 1})")
    assert "tp_half" not in registry.names()      # its half-done registration is undone
    assert "operator name 'relu' is taken by gdnflow.ops.elementwise.ReLU" in clashes.error
    assert registry.get("relu") is ReLUOp
    with pytest.raises(KeyError, match="plugin 'tp_broken' failed to load: ModuleNotFound"):
        registry.get("tp_half")
    assert cli.main(["plugins"]) == 1
    out = capsys.readouterr().out
    assert "tp_broken: tp-broken 0.1, module tp_broken\n  NOT LOADED: ModuleNotFoundError" in out
    assert "tp_clashes: tp-broken 0.1, module tp_clashes\n  NOT LOADED: ValueError" in out
    assert cli.main(["plugin-check", "tp_broken"]) == 1
    assert "plugin 'tp_broken' (module tp_broken) failed to load: ModuleNotFoundError" in (
        capsys.readouterr().err)


def test_gdnflow_imports_with_a_broken_plugin_installed(tmp_path):
    site = fake_distribution(tmp_path, "tp-broken", {"tp_broken": "tp_broken"},
                             {"tp_broken.py": "raise RuntimeError('plugin bug')\n"})
    root = Path(gdnflow.__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(root)]))
    script = ("import gdnflow, gdnflow.plugins as p; x = gdnflow.tensor([1.0], device='numpy'); "
              "print([(r.name, r.error) for r in p.load_installed()])")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "('tp_broken', 'RuntimeError: plugin bug (at " in result.stdout


# --------------------------------------------------------------- checks --
def test_example_inputs_forms_and_errors():
    import numpy as np
    rng = np.random.default_rng(0)

    class Declared(plugins.Operator):
        example_inputs = {"x": (2, 3), "w": np.ones(3)}

    class Computed(plugins.Operator):
        def example_inputs(self, rng):
            return {"p": rng.uniform(0.1, 0.9, (4,))}

    names, arrays = plugins.example_arrays(Declared(), rng)
    assert names == ["x", "w"] and arrays[0].shape == (2, 3) and arrays[1].tolist() == [1, 1, 1]
    names, arrays = plugins.example_arrays(Computed(), rng)
    assert names == ["p"] and np.all((arrays[0] > 0.1) & (arrays[0] < 0.9))
    with pytest.raises(plugins.PluginError, match="Operator declares no example_inputs"):
        plugins.example_arrays(plugins.Operator(), rng)
    Declared.example_inputs = {"x": (2, -3)}
    with pytest.raises(plugins.PluginError, match=r"example_inputs\['x'\] should be a shape"):
        plugins.example_arrays(Declared(), rng)


def test_plugin_check_passes_a_right_backward_and_fails_a_wrong_one(tmp_path, capsys):
    assert cli.main(["plugin-check", str(cube_file(tmp_path, "tp_right"))]) == 0
    assert "tp_right: gradcheck (numpy, float64): passed" in capsys.readouterr().out
    assert cli.main(["plugin-check", str(cube_file(tmp_path, "tp_wrong", factor=2))]) == 1
    err = capsys.readouterr().err
    assert "tp_wrong: FAILED: AssertionError: tp_wrong on inputs x (2, 3): gradcheck" in err
    assert "gradient of input 'x'" in err


def test_plugin_check_explains_an_unknown_name(capsys):
    assert cli.main(["plugin-check", "tp_nothing"]) == 1
    assert "no plugin, plugin path or operator named 'tp_nothing'" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["plugins", "plugin-check"])
def test_a_malformed_arch_is_a_usage_error_naming_the_option(command, capsys):
    # It reached nvcc, whose failure was reported as the plugin's source not compiling.
    argv = [command] + (["relu"] if command == "plugin-check" else []) + ["--arch", "90"]
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    assert (f"gdnflow {command}: --arch: expected a GPU architecture such as sm_90, got '90'"
            in capsys.readouterr().err)


def test_compile_check_without_nvcc_says_so(tmp_path):
    with pytest.raises(BackendUnavailableError, match="nvcc is not on PATH"):
        plugins.compile_check(write(tmp_path / "k.cu", GOOD_CU), compiler=KernelCache(nvcc=""))


@needs_nvcc
def test_compile_errors_name_plugin_file_line_and_nvcc_message(tmp_path):
    package = tmp_path / "tp_badcu"
    write(package / "__init__.py", "")
    good = write(package / "good.cu", GOOD_CU)
    # One with gdnflow's header (pasted in by expand_source), one without:
    # the line must be the file's own in both.
    with_header = write(package / "with_header.cu", GOOD_CU + "\n__device__ float f() {\n"
                        "    float y = ;\n    return y;\n}\n")
    plain = write(package / "plain.cu", "__device__ int g() {\n    return undefined_name;\n}\n")
    plugin = plugins.load(package)
    with pytest.raises(KernelCompileError) as caught:
        plugins.compile_check(plugin)
    message = str(caught.value)
    assert f"plugin 'tp_badcu' (module tp_badcu): nvcc failed on {with_header}, line 9:" in message
    assert "error: expected an expression" in message
    assert f"plugin 'tp_badcu' (module tp_badcu): nvcc failed on {plain}, line 2:" in message
    assert 'identifier "undefined_name" is undefined' in message
    assert str(good) not in message
    # A single file of the plugin, given by path, is still named as the plugin's.
    with pytest.raises(KernelCompileError, match=r"^plugin 'tp_badcu' .* on .*plain\.cu, line 2"):
        plugins.compile_check(plain)


@needs_nvcc
def test_gdnflow_plugins_reports_a_kernel_that_does_not_compile(tmp_path, monkeypatch, capsys):
    site = fake_distribution(tmp_path, "tp-badpkg", {"tp_badpkg": "tp_badpkg"}, {
        "tp_badpkg/__init__.py": CUBE.format(name="tp_badpkg_cube", factor=3),
        "tp_badpkg/k.cu": "__global__ void k() { int x = ; }\n"})
    monkeypatch.syspath_prepend(str(site))
    assert cli.main(["plugins"]) == 1
    out = capsys.readouterr().out
    assert ("tp_badpkg: tp-badpkg 0.1, module tp_badpkg\n"
            "  loaded; operators: tp_badpkg_cube\n") in out
    assert (f"  CUDA: DOES NOT COMPILE\n    plugin 'tp_badpkg' (module tp_badpkg): nvcc failed on "
            f"{site / 'tp_badpkg' / 'k.cu'}, line 1:") in out


def test_a_loaded_plugin_names_itself_as_the_owner_of_its_sources(tmp_path):
    # What the kernel loader asks when nvcc fails (the GPU test below runs the loader).
    package = tmp_path / "tp_owner"
    write(package / "__init__.py", "")
    cu = write(package / "k.cu", GOOD_CU)
    plugins.load(package)
    assert sources.owner_of(cu) == "plugin 'tp_owner' (module tp_owner)"
    assert sources.owner_of(tmp_path / "elsewhere.cu") is None


@pytest.mark.gpu
def test_the_kernel_loader_names_the_plugin_too(tmp_path):
    from gdnflow.backends.cuda import kernels     # local import: PyCUDA, on the GPU machine only
    package = tmp_path / "tp_loaderr"
    write(package / "__init__.py", "")
    bad = write(package / "bad.cu", GOOD_CU + "\n__device__ float f() { float y = ; return y; }\n")
    plugins.load(package)
    with pytest.raises(KernelCompileError) as caught:
        kernels.load_module(bad, (("TILE", 8),))
    message = str(caught.value)
    assert message.startswith(f"plugin 'tp_loaderr' (module tp_loaderr): nvcc failed on {bad}, "
                              "line 8 (defines {'TILE': 8}):\n")
    assert "error: expected an expression" in message


@needs_nvcc
def test_compile_check_of_inline_source():
    good, bad = InlineSource(GOOD_CU, "mine.cu"), InlineSource("int h() {\n  return nothing;\n}\n")
    assert plugins.compile_check(good) == [good]
    with pytest.raises(KernelCompileError, match=r"^nvcc failed on inline\.cu, line 2:"):
        plugins.compile_check(bad)


def test_inline_sources_are_cache_keys_by_value():
    assert InlineSource("a", "x.cu") == InlineSource("a", "x.cu")
    assert hash(InlineSource("a", "x.cu")) == hash(InlineSource("a", "x.cu"))
    assert InlineSource("a", "x.cu") != InlineSource("b", "x.cu")
    expanded = expand_source(InlineSource(GOOD_CU, "mine.cu"))
    assert "#define GRID_STRIDE_LOOP" in expanded and '"mine.cu"' in expanded


def test_compile_error_message():
    output = "kernel.cu(12): error: expected a \";\"\n1 error detected"
    assert compile_error_message("/p/k.cu", output, (("TILE", 16),), "plugin 'x' (module x)") == (
        "plugin 'x' (module x): nvcc failed on /p/k.cu, line 12 (defines {'TILE': 16}):\n" + output)
    assert compile_error_message("k.cu", "nvcc fatal : bad option") == (
        "nvcc failed on k.cu:\nnvcc fatal : bad option")


# y = x * scale; the tests write a wrong gradient for the scale.
SCALE = '''
from gdnflow import plugins

@plugins.register("{name}")
class Scale(plugins.Operator):
    """y = x * scale (elementwise, same shapes)."""
    example_inputs = {{"x": (2, 3), "scale": (2, 3)}}

    def forward_numpy(self, x, scale):
        self.save(x=x, scale=scale)
        return x * scale

    def backward(self, gy):
        x, scale = self.saved.x, self.saved.scale
        return (gy * self.wrap(scale), gy * self.wrap({factor} * x))
'''


def test_gradient_failures_name_the_declared_input(tmp_path, capsys):
    path = write(tmp_path / "tp_scale.py", SCALE.format(name="tp_scale", factor=2))
    assert cli.main(["plugin-check", str(path)]) == 1
    err = capsys.readouterr().err
    assert "tp_scale on inputs x (2, 3), scale (2, 3): gradcheck (numpy, float64) failed: " \
        "gradient of input 'scale' (shape (2, 3))" in err
    assert "gdnflow plugin-check: 0 of 1 operators passed" in err


@pytest.mark.skipif(gdnflow.cuda_available(), reason="tests the machine without a GPU")
def test_plugin_check_says_when_cuda_did_not_run(tmp_path, capsys):
    path = str(cube_file(tmp_path, "tp_nogpu"))
    assert cli.main(["plugin-check", path]) == 0
    out = capsys.readouterr().out
    assert "tp_nogpu: cuda against numpy (float32): NOT RUN (no CUDA device: " in out
    assert out.endswith("plugin-check: 1 of 1 operators passed; "
                        "CUDA against NumPy NOT RUN (no CUDA device)\n")
    assert cli.main(["plugin-check", path, "--require-gpu"]) == 1
    assert "--require-gpu asks for it" in capsys.readouterr().err


def test_plugin_check_sums_up_a_kernel_check_that_did_not_run(tmp_path, monkeypatch, capsys):
    # The plugin's line said NOT RUN, but the last line read as if its kernels were checked.
    write(tmp_path / "k.cu", GOOD_CU)
    path = str(cube_file(tmp_path, "tp_nonvcc"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))           # no nvcc on it
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))  # nor there
    assert cli.main(["plugin-check", path]) == 0
    out = capsys.readouterr().out
    assert "  CUDA: NOT RUN (nvcc is not on PATH" in out
    assert out.splitlines()[-1].startswith("plugin-check: 1 of 1 operators passed; kernel "
                                           "compile check NOT RUN (no nvcc)")


def test_info_lists_plugin_operators_with_their_plugin(tmp_path, monkeypatch, capsys):
    site = fake_distribution(tmp_path, "tp-info", {"tp_info": "tp_info"},
                             {"tp_info.py": CUBE.format(name="tp_info_cube", factor=3)})
    monkeypatch.syspath_prepend(str(site))
    assert cli.main(["info"]) == 0
    lines = capsys.readouterr().out.splitlines()
    (operators,) = [line for line in lines if line.startswith("operators: ")]
    (plugin_operators,) = [line for line in lines if line.startswith("plugin operators: ")]
    assert "relu" in operators.split() and "tp_info_cube" not in operators.split()
    assert "tp_info_cube (plugin 'tp_info', tp-info 0.1)" in plugin_operators


@needs_nvcc
def test_nvcc_compiles_a_plugin_source_with_the_include_dir(tmp_path, capsys):
    assert cli.main(["info", "--include"]) == 0
    include = capsys.readouterr().out.strip()
    assert Path(include) == plugins.include_dir()
    cu = write(tmp_path / "cube.cu", GOOD_CU)
    command = [NVCC, "-arch=sm_90", "--ptx", str(cu), "-o", str(tmp_path / "cube.ptx")]
    without = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert without.returncode != 0 and "gdnflow_common.cuh" in without.stderr
    run = subprocess.run(command[:1] + [f"-I{include}"] + command[1:], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    entries = kernel_arguments.ptx_entries((tmp_path / "cube.ptx").read_text())
    assert [(p.size, p.kind) for p in entries["cube_forward"]] == [(8, "int"), (8, "int"),
                                                                   (4, "int")]


# ------------------------------------------------------- kernel arguments --
# Eight parameters, of three kinds; and a struct passed by value.
ARGUMENTS_CU = '''#include "gdnflow_common.cuh"
struct Window { int start; int stop; float weight; };

extern "C" __global__ void scale_backward(const float* x, const float* s, const float* gy,
                                          float* gx, float* gs, int n, int channels, float eps) {
    GRID_STRIDE_LOOP(i, n) { gx[i] = gy[i] * s[i % channels] + eps; gs[0] = x[0]; }
}

extern "C" __global__ void windowed(float* y, Window w, long long n) {
    if (threadIdx.x < n) y[w.start] = w.weight;
}
'''

ARGUMENTS_PY = '''from gdnflow import plugins

SOURCE = plugins.source_file(__file__, "args.cu")
TYPES = "PPPPP" + "ii" + "f"


def launches(name, types):
    plugins.kernel(SOURCE, "scale_backward", TYPES)                 # right
    plugins.kernel(SOURCE, "windowed", "P" + "iif" + "q")           # right: the struct's fields
    plugins.kernel(SOURCE, "scale_backward", "PPPii")               # too few
    plugins.kernel(file=SOURCE, name="scale_backward", arg_types="PPPPPiii")   # i for f
    plugins.kernel(SOURCE, "windowed", "Pifq")                      # a field short
    plugins.kernel(SOURCE, "scale_forward", "PPi")                  # no such kernel
    plugins.kernel(SOURCE, name, "PPi")                             # not readable here
    plugins.kernel(SOURCE, "windowed", types)                       # types unreadable
'''


@pytest.fixture(scope="module")
def argument_report(tmp_path_factory):
    """The kernel-argument check of a package with right and wrong declarations (one nvcc run)."""
    package = tmp_path_factory.mktemp("plugin") / "tp_args"
    write(package / "args.cu", ARGUMENTS_CU)
    write(package / "__init__.py", ARGUMENTS_PY)
    return plugins.check_kernel_arguments(package), package


def declared_on(line_text):
    """ "tp_args/__init__.py:LINE" of the line of ARGUMENTS_PY holding ``line_text``."""
    (line,) = [n for n, text in enumerate(ARGUMENTS_PY.splitlines(), 1) if line_text in text]
    return f"tp_args/__init__.py:{line}"


@needs_nvcc
def test_kernel_arguments_wrong_count_type_missing_and_unreadable(argument_report):
    report, package = argument_report
    assert report.files == [package / "args.cu"]
    assert report.checked == [f"{declared_on('TYPES)')} scale_backward",
                              f"{declared_on('fields')} windowed"]
    assert report.problems == [
        f"'scale_backward' takes 8 parameters (P P P P P i i f) in args.cu; "
        f"{declared_on('too few')} declares 'PPPii' (5)",
        f"'scale_backward' parameter 7 is a 4-byte float (f) in args.cu; "
        f"{declared_on('i for f')} declares 'i' (4-byte int) in 'PPPPPiii'",
        f"'windowed' takes 3 parameters (P {{12 bytes}} P) in args.cu; "
        f"{declared_on('field short')} declares 'Pifq' (4)",
        f"missing kernel: {declared_on('no such')} declares 'scale_forward'; searched args.cu: "
        'no extern "C" __global__ kernel of that name']
    assert report.not_checked == [
        f"{declared_on('SOURCE, name,')} (kernel name computed, not a string constant)",
        f"{declared_on('types unreadable')} (argument types computed, not a string constant)"]


def test_ptx_parameter_lists():
    ptx = """
.visible .entry k(
\t.param .u64 .ptr .align 1 k_param_0,
\t.param .f64 k_param_1,
\t.param .align 8 .b8 k_param_2[24],
\t.param .u16 k_param_3
)
.weak .entry none()
"""
    entries = kernel_arguments.ptx_entries(ptx)
    Parameter = kernel_arguments.Parameter
    assert entries == {"k": [Parameter(8, "int", align=8), Parameter(8, "float", align=8),
                             Parameter(24, "bits", struct=True, align=8),
                             Parameter(2, "int", align=2)], "none": []}

    def problems(arg_types):
        declaration = kernel_arguments.Declaration("m.py:3", "k", arg_types, "k.cu")
        return kernel_arguments.compare(declaration, entries["k"], "k.cu")
    assert problems("Pd" + "ddi" + "H") == []        # the struct's fields, padded to 24 bytes
    assert problems("Pd" + "3d" + "Q") == [
        "'k' parameter 3 is a 2-byte int (h) in k.cu; m.py:3 declares 'Q' (8-byte int) in "
        "'Pd3dQ'"]
    assert problems("Pf" + "ddd" + "h") == [
        "'k' parameter 1 is a 8-byte float (d) in k.cu; m.py:3 declares 'f' (4-byte float) in "
        "'Pfdddh'"]
    assert problems("Pd" + "dq" + "h")[0].startswith("'k' takes 4 parameters (P d {24 bytes} h)")
    assert problems("Pd" + "24s" + "h") == []        # the struct packed as bytes: one argument
    assert problems("Pd" + "16s" + "h")[0].startswith("'k' takes 4 parameters (P d {24 bytes} h)")


@needs_nvcc
def test_compile_check_refuses_wrong_kernel_arguments(tmp_path):
    write(tmp_path / "k.cu", GOOD_CU)
    write(tmp_path / "tp_k.py", 'from gdnflow import plugins\n'
          'plugins.kernel(plugins.source_file(__file__, "k.cu"), "cube_forward", "PPf")\n')
    with pytest.raises(KernelArgumentError, match=r"^'cube_forward' parameter 2 is a 4-byte int "
                       r"\(i\) in k\.cu; \S*tp_k\.py:2 declares 'f' \(4-byte float\)"):
        plugins.compile_check(tmp_path / "tp_k.py", arch="sm_80")


# --------------------------------------------------------------- the tutorial --
DOCS = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"


@pytest.mark.skipif(not DOCS.exists(), reason="docs/ is not part of an installed package")
def test_the_tutorial_files_work(tmp_path):
    # Every file the tutorial shows starts with a "file: PATH" comment line.
    import re
    blocks = re.findall(r"```\w*\n((?:#|//) file: (\S+)\n.*?)```", DOCS.read_text(), re.S)
    for text, relative in blocks:
        write(tmp_path / relative, text)
    assert {relative for _, relative in blocks} >= {
        "gdnflow_swish/__init__.py", "gdnflow_swish/swish.cu", "gdnflow_swish/swish_op.py",
        "gdnflow_swish/prelu.cu", "gdnflow_swish/prelu_op.py", "setup.cfg", "pyproject.toml",
        "train.py", "tests/test_swish.py"}
    plugin = plugins.load(tmp_path / "gdnflow_swish")
    assert plugin.operators() == ["prelu", "swish"]
    for name in plugin.operators():
        assert plugins.check_operator(registry.get(name))[0].startswith(
            "gradcheck (numpy, float64): passed")
    if NVCC:
        # Both kernels' files compile and all four kernel(...) calls match their kernels.
        report = plugins.check_kernel_arguments(plugin)
        assert report.ok and len(report.checked) == 4 and not report.not_checked, report
    root = Path(gdnflow.__file__).resolve().parents[1]
    env = dict(os.environ, GDNFLOW_DEVICE="numpy",
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(root)]))
    run = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    losses = [float(line.split()[-1]) for line in run.stdout.splitlines()]
    assert len(losses) == 4 and losses[-1] < 0.05 * losses[0], run.stdout
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "tests"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
    assert tests.returncode == 0 and "2 passed" in tests.stdout, tests.stdout + tests.stderr
