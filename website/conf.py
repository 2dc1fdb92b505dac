"""Sphinx configuration of the course website (`python3 make.py site`, coursetools/publish/website.py).

Sphinx reads the folder that coursetools/publish/website.py stages from the repository (lessons,
released exercises, the cheat sheet, the myths page, the instructor guide, the home and
"about these outputs" pages); this file only says how to render it. Lessons were executed
before Sphinx starts (coursetools/publish/website.py, into a jupyter-cache), so myst-nb's "cache" mode
only reads their outputs; released exercises are shown as released, never executed.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coursetools import layout# noqa: E402

_cfg = layout.config()

project = _cfg.title
author = "the course's authors"
copyright = "the course's authors"
extensions = ["myst_nb"]

# Only what coursetools/publish/website.py staged; its bookkeeping and the execution cache are no pages.
exclude_patterns = ["_build", "**.ipynb_checkpoints", "site-manifest.json"]
root_doc = "index"

# Markdown: GitHub-style heading slugs, so that `page.ipynb#section` links (the cheat sheet's)
# resolve and are checked by Sphinx; raw HTML (the GPU record blocks' <details>) passes through.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# Notebooks: outputs come from the cache that coursetools/publish/website.py filled (it refuses to
# build when a lesson failed); exercises are never executed.
nb_execution_mode = "cache"
nb_execution_cache_path = os.environ["COURSE_SITE_CACHE"]
nb_execution_excludepatterns = ["exercises/*/*"]
nb_execution_raise_on_error = True
nb_execution_timeout = 180
nb_output_stderr = "warn"          # a lesson that writes to stderr fails the build (-W)
nb_merge_streams = True

html_theme = "sphinx_book_theme"
html_title = _cfg.title
html_static_path = ["_static"]
templates_path = ["_templates"]
html_favicon = "_static/favicon.svg"
# One search box at each width: the theme's sidebar search field, the second one on the desktop,
# is left out of the sidebar (the header's search field shows on a desktop, the article
# header's search button on a phone).
html_sidebars = {"**": ["navbar-logo.html", "icon-links.html", "sbt-sidebar-nav.html"]}
# "Last verified" on every page, above the footer (website.py: the runs' PyTorch and date).
html_context = {"course_last_verified": os.environ.get("COURSE_SITE_VERIFIED", "")}
html_css_files = ["course.css"]
html_js_files = ["course-toggles.js"]  # the menu buttons work (see the file)
html_last_updated_fmt = None
html_show_sphinx = False
html_copy_source = True            # the download buttons serve _sources/ (the repository's files)
html_theme_options = {
    "repository_url": f"https://github.com/{_cfg.github_repo}",
    "repository_branch": _cfg.branch,
    "path_to_docs": "",
    "use_repository_button": True,
    "use_download_button": True,
    "launch_buttons": {"colab_url": "https://colab.research.google.com"},
    "show_toc_level": 2,
    "home_page_in_toc": True,
    "footer_content_items": ["last-verified.html", "copyright.html"],
}
