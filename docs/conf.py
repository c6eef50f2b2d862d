"""Sphinx configuration: the API reference (autodoc + numpydoc) and the guides in docs/*.md (MyST).

Built by ``make docs`` with warnings as errors; ``tests/test_docs_build.py`` builds it too.
"""

project = "rsketch and decoding"
author = "the rsketch developers"
copyright = "2026, the rsketch developers"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "numpydoc",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "figures/*.csv"]
root_doc = "index"

templates_path = ["_templates"]
autosummary_generate = True
autodoc_default_options = {"members": False}
autodoc_typehints = "none"  # numpydoc sections carry the types
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 3
suppress_warnings = ["myst.xref_missing"]

intersphinx_mapping = {}  # no network here: references to other projects stay plain text

html_theme = "alabaster"
html_title = "rsketch and decoding"


def _skip_metadata_routing(app, what, name, obj, skip, options):
    """scikit-learn generates ``set_*_request`` on every estimator; they document scikit-learn, not us."""
    if name == "get_metadata_routing" or (name.startswith("set_") and name.endswith("_request")):
        return True
    return None


def setup(app):
    app.connect("autodoc-skip-member", _skip_metadata_routing)
