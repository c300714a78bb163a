"""Sphinx configuration of the householderla documentation.

Build (``make docs`` runs exactly this, offline, warnings are errors)::

    python -m sphinx -W --keep-going -b html -d docs/_build/doctrees docs docs/_build/html
    python -m sphinx -W --keep-going -b doctest -d docs/_build/doctrees docs docs/_build/doctest

The first builds the pages (running the ``.. plot::`` examples), the second runs every
``.. testcode::`` / ``.. doctest::`` block of the pages and the ``>>>`` examples of the
docstrings. Python examples are written as those directives, never as
``.. code-block:: python``: :func:`_require_executed_python` turns such a block into a
warning, hence an error.
"""

from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.abspath(".."))

from sphinx.application import Sphinx
from sphinx.util import logging

import householderla

logger = logging.getLogger(__name__)

# -- project -------------------------------------------------------------------------------
project = "householderla"
author = "householderla developers"
copyright = "householderla developers"
release = householderla.__version__
version = ".".join(release.split(".")[:2])

# -- extensions ----------------------------------------------------------------------------
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # MathJax 3 files copied into _static/mathjax (math offline)
    "sphinx.ext.doctest",  # the Python examples of the pages run (builder ``doctest``)
    "numpydoc",
    "matplotlib.sphinxext.plot_directive",  # gallery examples run at build time (``.. plot::``)
]

templates_path = ["_templates"]
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
root_doc = "index"
language = "en"
nitpicky = False
# Offline build: no intersphinx_mapping (it would fetch inventories from the network).

# -- autodoc / autosummary -----------------------------------------------------------------
autosummary_generate = True  # writes docs/api/generated/ (git-ignored)
autosummary_imported_members = False
autodoc_typehints = "none"  # the signatures use Any everywhere; the docstrings carry shapes
autodoc_member_order = "bysource"

# -- numpydoc ------------------------------------------------------------------------------
numpydoc_show_class_members = False
numpydoc_show_inherited_class_members = False
numpydoc_class_members_toctree = False
numpydoc_validation_checks: set[str] = set()  # no docstring validation here (ruff/CI do it)
numpydoc_xref_param_type = False
numpydoc_use_plots = False

# -- plot directive (examples run at build time, offline, with the Agg backend) -------------
plot_include_source = True
plot_html_show_source_link = False
plot_html_show_formats = False
plot_formats = [("png", 100)]

# -- math ----------------------------------------------------------------------------------
# MathJax ships with the pages: the extension sphinx-mathjax-offline (``docs`` extra) copies
# its MathJax 3 (tex-chtml component, fonts, TeX extensions) into _static/mathjax, and the
# pages load it from there, so math renders without network access. _check_offline_math
# fails the build if the file is missing.
mathjax_path = "mathjax/tex-chtml.js"  # relative to _static
mathjax3_config = {
    "tex": {
        "macros": {
            "R": r"\mathbb{R}",
            "C": r"\mathbb{C}",
            "striu": r"\operatorname{striu}",
            "diag": r"\operatorname{diag}",
            "tr": r"\operatorname{tr}",
            "St": r"\operatorname{St}",
        }
    }
}

# -- doctest (executed examples) -------------------------------------------------------------
# The blocks of one page share one namespace (group "default") and run in page order; each
# page imports what it uses, in view of the reader (no global setup). A block that cannot run
# on the build machine (e.g. one that needs a GPU) takes ``:skipif:`` with a condition, and
# the page says why.
doctest_global_setup = ""
# The pages' examples and the ``>>>`` examples of the docstrings shown on the API pages run.
doctest_test_doctest_blocks = "default"

# -- HTML ----------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"householderla {release}"
html_static_path: list[str] = []
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "navbar_align": "left",
    "secondary_sidebar_items": ["page-toc"],
}
html_sidebars = {"index": [], "install": [], "quickstart": [], "design": []}
html_show_sourcelink = False


# -- checks of this project ----------------------------------------------------------------
# A Python example that does not run can rot unnoticed: the pages write them as
# ``.. testcode::`` / ``.. doctest::`` (run by the doctest builder), never as a code block.
_UNEXECUTED_PYTHON = re.compile(
    r"^[ \t]*\.\. (?:code-block|code|sourcecode)::\s*(?:python3?|py|pycon|ipython3?)\s*$",
    re.MULTILINE,
)


def _require_executed_python(app: Sphinx, docname: str, source: list[str]) -> None:
    for match in _UNEXECUTED_PYTHON.finditer(source[0]):
        line = source[0].count("\n", 0, match.start()) + 1
        logger.warning(
            "a Python example as %r does not run in the docs build; write it as "
            "'.. testcode::' (or '.. doctest::' for >>> sessions)",
            match.group().strip(),
            location=(docname, line),
        )


def _check_offline_math(app: Sphinx, exc: Exception | None) -> None:
    """The pages load MathJax from _static/mathjax (see ``mathjax_path``); fail if it is absent."""
    if exc is not None or app.builder.format != "html":
        return
    mathjax = os.path.join(app.outdir, "_static", app.config.mathjax_path)
    if not os.path.isfile(mathjax):
        raise RuntimeError(
            f"{mathjax} is missing: math would not render (is the 'docs' extra "
            "installed, with sphinx-mathjax-offline?)"
        )


def setup(app: Sphinx) -> dict[str, bool]:
    app.connect("source-read", _require_executed_python)
    # after sphinx-mathjax-offline's own build-finished handler, which copies the files
    app.connect("build-finished", _check_offline_math, priority=900)
    return {"parallel_read_safe": True}
