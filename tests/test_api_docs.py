"""The API reference (docs/api, Sphinx autodoc) builds with warnings as errors, documents
every name the public packages export, and shows their examples as code: a docstring
that reST misreads, or an export nobody documented, fails CI."""
import importlib
import pathlib
import re
import subprocess
import sys
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "api"

#: The modules whose public names the reference must document: each one's ``__all__``,
#: else its public names that are not modules.
PUBLIC_MODULES = ("gdnflow", "gdnflow.ops", "gdnflow.ops.conv", "gdnflow.ops.gdn",
                  "gdnflow.nn", "gdnflow.models", "gdnflow.optim", "gdnflow.config",
                  "gdnflow.registry", "gdnflow.errors", "gdnflow.io", "gdnflow.io.keras",
                  "gdnflow.codec", "gdnflow.train", "gdnflow.data", "gdnflow.inference",
                  "gdnflow.step", "gdnflow.sparse", "gdnflow.classify", "gdnflow.plugins",
                  "gdnflow.testing")

#: Anchors each page must hold: {page: names documented on it}.
KEY_NAMES = {
    "tensor": ("gdnflow.Tensor", "gdnflow.no_grad", "gdnflow.compile", "gdnflow.compile_step",
               "gdnflow.set_default_device"),
    "ops": ("gdnflow.ops.conv2d", "gdnflow.ops.gdn", "gdnflow.ops.add"),
    "nn": ("gdnflow.nn.Module", "gdnflow.nn.GDN", "gdnflow.nn.Conv2d"),
    "models": ("gdnflow.models.ScaleHyperprior", "gdnflow.models.FactorizedPrior",
               "gdnflow.models.mobilenet_v2", "gdnflow.models.vgg16", "gdnflow.codec.pretrained"),
    "codec": ("gdnflow.codec.Codec", "gdnflow.codec.Codec.compress",
              "gdnflow.codec.Codec.decompress", "gdnflow.codec.evaluate.evaluate"),
    "train": ("gdnflow.train.TrainConfig", "gdnflow.train.Trainer", "gdnflow.train.train"),
    "io": ("gdnflow.io.checkpoint.save_checkpoint", "gdnflow.io.onnx.load", "gdnflow.io.keras.load"),
}

pytestmark = [
    pytest.mark.skipif(not (DOCS / "conf.py").is_file(),
                       reason=f"no Sphinx project at {DOCS} (gdnflow installed without its checkout)"),
]


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """The reference built once, as docs/api/README.md builds it: (sphinx-build's result,
    the html folder). With --keep-going the pages are written even when a warning fails it."""
    pytest.importorskip("sphinx", reason="Sphinx is not installed (pip install 'gdnflow[docs]')")
    out = tmp_path_factory.mktemp("api-html")
    # cwd=out: run from the checkout, ``python -m`` would put it first on sys.path, and
    # autodoc would document the checkout rather than the gdnflow these tests import.
    result = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q",
                             "-b", "html", str(DOCS), str(out)],
                            cwd=out, capture_output=True, text=True, timeout=300)
    return result, out


@pytest.fixture(scope="module")
def built(build):
    """The html folder of the reference."""
    return build[1]


def documented_objects(html):
    """{documented name: the object it names}, from the build's objects.inv; names that do
    not resolve to an attribute (instance attributes) are left out."""
    from sphinx.util.inventory import InventoryFile   # local import: sphinx is optional (skip above)
    with open(html / "objects.inv", "rb") as f:
        inventory = InventoryFile.load(f, "", lambda base, uri: uri)
    objects = {}
    for kind, entries in inventory.items():
        if not kind.startswith("py:"):
            continue
        for name in entries:
            try:
                objects[name] = (importlib.import_module(name) if kind == "py:module"
                                 else attribute_by_name(name))
            except (AttributeError, ImportError):
                continue
    return objects


def attribute_by_name(name):
    """The object ``a.b.c`` names, as autodoc finds it: attribute by attribute from the top
    package (``gdnflow.ops.gdn`` is the function of that name), else from the longest
    prefix that imports as a module (``gdnflow.ops.gdn.GDNOp``: the package's class)."""
    parts = name.split(".")
    for start in [1] + list(range(len(parts) - 1, 0, -1)):
        try:
            obj = importlib.import_module(".".join(parts[:start]))
            for part in parts[start:]:
                obj = getattr(obj, part)
            return obj
        except (AttributeError, ImportError):
            continue
    raise AttributeError(f"{name} names no object")


def public_names(module):
    """``module.__all__``, else its public names that are not modules (with gdnflow's lazily
    loaded functions, ``gdnflow.compile``...)."""
    if hasattr(module, "__all__"):
        return list(module.__all__)
    names = [name for name, value in vars(module).items()
             if not name.startswith("_") and not isinstance(value, types.ModuleType)]
    return names + list(getattr(module, "LAZY_FUNCTIONS", ()))


def test_reference_builds_without_warnings(build):
    result, out = build
    assert result.returncode == 0, (f"sphinx-build -W docs/api failed (exit {result.returncode}):\n"
                                    f"{result.stderr[-6000:]}")
    assert (out / "index.html").is_file()


@pytest.mark.parametrize("page", sorted(KEY_NAMES))
def test_pages_document_their_key_names(built, page):
    html = (built / f"{page}.html").read_text()
    missing = [name for name in KEY_NAMES[page] if f'id="{name}"' not in html]
    assert not missing, f"docs/api/{page}.rst does not document {missing}"


def test_every_exported_name_is_documented(built):
    objects = documented_objects(built)
    documented_ids = {id(obj) for obj in objects.values()}
    missing = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in public_names(module):
            # Documented under this name, or under the name of the module that defines it.
            if f"{module_name}.{name}" not in objects and id(getattr(module, name)) not in documented_ids:
                missing.append(f"{module_name}.{name}")
    assert not missing, f"exported but not in the API reference (docs/api/*.rst): {missing}"


def test_examples_render_as_code(built):
    # An indented example after a paragraph that does not end in "::" is a block quote
    # to reST: its lines run together as one paragraph of text.
    quoted = {page.name: re.findall(r"<blockquote>\s*<div><p>(.{0,60})", page.read_text())
              for page in built.glob("*.html")}
    quoted = {name: starts for name, starts in quoted.items() if starts}
    assert not quoted, f"indented blocks rendered as text, not code (end the line before with '::'): {quoted}"
