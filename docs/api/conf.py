"""Sphinx configuration of gdnflow's API reference, generated from the docstrings.

Build: ``sphinx-build -W --keep-going -b html docs/api docs/_build/api`` (README.md here).

autodoc imports the gdnflow that Python finds: the installed package (CI installs it
with ``pip install .``, and tests/test_api_docs.py builds this reference in CI), or the
checkout with ``PYTHONPATH=.``. This file does not put the checkout on ``sys.path``:
the reference describes the package the tests ran against.

No import is mocked: ``import gdnflow`` and every module documented here import
without PyCUDA (they load it on first GPU use), and the modules that need it at import
time (``gdnflow.backends.cuda.runtime``, ``kernels``, ``blas``, ``graphs``) are not in
the reference. A mock would also make PyCUDA look importable to code that probes for it.
"""
from gdnflow.version import __version__

project = "gdnflow"
author = "gdnflow's authors"
copyright = "gdnflow's authors, MIT licence"
release = version = __version__

extensions = ["sphinx.ext.autodoc"]

# Members in source (and __all__) order: a package's names in the order its author
# grouped them, a class's methods as they read in the file.
autodoc_member_order = "bysource"
# A page that shows some of a module's names uses ``:no-members:`` and one directive per
# name: Sphinx lets this boolean default override a directive's ``:members: a, b`` list.
autodoc_default_options = {"members": True, "show-inheritance": True}
# A class's docstring states its contract; its __init__ parameters are in the signature.
autoclass_content = "class"
# Default argument values as written in the source (``256 << 20``, not 268435456).
autodoc_preserve_defaults = True

html_theme = "alabaster"
html_title = f"gdnflow {release} API reference"
html_show_sourcelink = False
