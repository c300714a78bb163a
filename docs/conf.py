"""Sphinx configuration of the householderla documentation.

Build (CI runs exactly this, offline, warnings are errors)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

import householderla

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
# MathJax is loaded by the reader's browser; nothing is fetched at build time.
mathjax3_config = {
    "tex": {
        "macros": {
            "R": r"\mathbb{R}",
            "striu": r"\operatorname{striu}",
            "diag": r"\operatorname{diag}",
            "tr": r"\operatorname{tr}",
            "St": r"\operatorname{St}",
        }
    }
}

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
