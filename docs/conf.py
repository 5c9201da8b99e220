# Sphinx configuration of hora's manual. Built offline from Debian 12's
# python3-sphinx and python3-myst-parser: no intersphinx, no downloaded theme.
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
top = os.path.dirname(here)

project = "hora"
author = "the hora authors"
copyright = "the hora authors"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path = []
# Code blocks without a language (pictures, trees) are shown as they are.
highlight_language = "none"
# Headings get anchors, so pages can link to a section: page.md#section.
myst_heading_anchors = 3
myst_enable_extensions = []

# The C API reference is generated from the headers at every build, so it
# cannot drift from them.
subprocess.run([sys.executable, os.path.join(here, "gen_api.py"),
                os.path.join(here, "api.md")]
               + [os.path.join(top, "include", h)
                  for h in ("hora.h", "hora_mpi.h", "hora_cuda.h")],
               check=True)
