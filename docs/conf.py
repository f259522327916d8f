"""The documentation site (`make docs`): Sphinx, MyST for the Markdown pages, autodoc for
the reference, built with warnings as errors (a broken link or anchor, a docstring that
does not parse, a public name without a reference entry fails the build)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import django

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS.parent), str(DOCS / "_ext")]
# autodoc imports the Django tier (models, the middleware, django-celery-beat's scheduler)
os.environ["DJANGO_SETTINGS_MODULE"] = "docs_settings"
django.setup()

import celery_deadlines  # noqa: E402

project = "celery-deadlines"
author = "celery-deadlines developers"
copyright = "celery-deadlines developers"
release = version = celery_deadlines.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "public_surface",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext"]

myst_enable_extensions = ["colon_fence", "deflist"]
# the pages link to each other's sections as GitHub renders them (#give-a-task-a-deadline)
myst_heading_anchors = 4
suppress_warnings = ["myst.header"]  # a page's sections may start at ### under a table

autodoc_default_options = {"show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autoclass_content = "both"
# a method Celery, requests or grpc documents is theirs: its docstring is not repeated
autodoc_inherit_docstrings = False
# the docstrings name internal classes (:class:`~celery_deadlines.rules.gates.Decision`):
# a name the reference does not document renders as code, not as a broken link
nitpicky = False

html_theme = "furo"
html_title = f"celery-deadlines {release}"
html_static_path: list[str] = []
html_show_sourcelink = False
