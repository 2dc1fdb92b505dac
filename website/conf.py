"""Sphinx configuration of the course website (`python3 make.py site`, coursetools/publish/website.py).

Sphinx reads the folder that coursetools/publish/website.py stages from the repository (lessons,
released exercises, the cheat sheet, the myths page, the instructor guide, the home and
"about these outputs" pages); this file only says how to render it. Lessons were executed
before Sphinx starts (coursetools/publish/website.py, into a jupyter-cache), so myst-nb's "cache" mode
only reads their outputs; released exercises are shown as released, never executed.
"""

import json
import os
import posixpath
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coursetools import layout# noqa: E402

_cfg = layout.config()
# The edition being built (coursetools/publish/website.py, sphinx_context): English, or the
# Chinese one under zh/; its language, title, "Last verified" line and language switch.
EDITION = json.loads(os.environ.get("COURSE_SITE_EDITION") or "{}")
try:  # the Chinese search splits words with jieba, which logs its dictionary loading at DEBUG
    import logging

    import jieba
    jieba.setLogLevel(logging.WARNING)
except ImportError:
    pass

project = EDITION.get("title") or _cfg.title
language = EDITION.get("language", "en")
author = "the course's authors"
copyright = "the course's authors"
extensions = ["myst_nb", "sphinx_copybutton"]
# The copy button (sphinx-copybutton) on code a reader runs: lesson and exercise code cells and
# code blocks in pages, not outputs; it copies the code without prompts or outputs.
copybutton_selector = "div.cell_input div.highlight pre, div.highlight-python div.highlight pre, " \
                      "div.highlight-bash div.highlight pre, div.highlight-default div.highlight pre"
copybutton_exclude = ".linenos, .gp, .go"

# Only what coursetools/publish/website.py staged; its bookkeeping and the execution cache are no pages.
exclude_patterns = ["_build", "**.ipynb_checkpoints", "site-manifest.json"]
root_doc = "index"

# Markdown: GitHub-style heading slugs, so that `page.ipynb#section` links (the cheat sheet's)
# resolve and are checked by Sphinx; raw HTML (the GPU record blocks' <details>) passes through.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# Notebooks: outputs come from the cache that coursetools/publish/website.py filled (it refuses to
# build when a lesson failed); exercises are never executed.
nb_execution_mode = EDITION.get("execution", "cache")  # "off": the Chinese edition carries the English run's outputs
nb_execution_cache_path = os.environ["COURSE_SITE_CACHE"]
nb_execution_excludepatterns = ["exercises/*/*"]
nb_execution_raise_on_error = True
nb_execution_timeout = 180
nb_output_stderr = "warn"          # a lesson that writes to stderr fails the build (-W)
nb_merge_streams = True

html_theme = "sphinx_book_theme"
html_title = EDITION.get("title") or _cfg.title
html_static_path = ["_static"]
templates_path = ["_templates"]
html_favicon = "_static/favicon.svg"
# One search box at each width: the theme's sidebar search field, the second one on the desktop,
# is left out of the sidebar (the header's search field shows on a desktop, the article
# header's search button on a phone).
html_sidebars = {"**": ["navbar-logo.html", "icon-links.html", "sbt-sidebar-nav.html"]}
# "Last verified" on every page, above the footer (website.py: the runs' PyTorch and date).
# The theme's light/dark mode before a reader picks one: "auto" follows the system (without it
# every first visit starts with mode "" and logs "Got invalid theme mode: . Resetting to auto.").
html_context = {"default_mode": "auto",
                "course_last_verified": EDITION.get("verified", ""),
                "course_verified_label": EDITION.get("verified_label", "Last verified: "),
                "course_about_label": EDITION.get("about_label", "about these outputs")}
html_css_files = ["course.css"]
# The menu buttons work (course-toggles.js); a pasted error message finds its cheat-sheet row
# first (course-search.js, reading _static/course-errors.json that website.py writes).
html_js_files = ["course-toggles.js", "course-search.js", "course-code.js", "course-figures.js"]
html_last_updated_fmt = None
html_show_sphinx = False
html_copy_source = True            # the download buttons serve _sources/ (the repository's files)
html_theme_options = {
    "repository_url": f"https://github.com/{_cfg.github_repo}",
    "repository_branch": _cfg.branch,
    # The launch (Colab) and repository buttons open this edition's own notebook: the Chinese
    # edition's pages are staged at course/..., its notebooks are zh/course/... in the repository.
    "path_to_docs": EDITION.get("repo_dir", ""),
    "use_repository_button": True,
    "use_download_button": True,
    "launch_buttons": {"colab_url": "https://colab.research.google.com"},
    "show_toc_level": 2,
    "home_page_in_toc": False,        # the site title above the sidebar links home (no entry repeating it)
    "footer_content_items": ["last-verified.html", "copyright.html"],
    # The language switch, next to the article header's buttons (shown at every width).
    "article_header_end": ["language-switch.html", "article-header-buttons.html"],
}


def _language_switch(app, pagename, templatename, context, doctree):
    """The other edition's version of this page (its home page where it has none)."""
    switch = EDITION.get("switch")
    if not switch:
        return
    target = pagename if pagename in switch["pages"] else "index"
    up = "../" * pagename.count("/")
    context["course_language_switch"] = {
        "href": posixpath.normpath(up + switch["base"] + target) + ".html",
        "label": switch["label"], "hreflang": switch["hreflang"], "same_page": target == pagename}


def _chinese_search(app):
    """The Chinese edition's search, repaired twice over (the class it registers replaces
    Sphinx's for `language = "zh_CN"`):

    - the query is split into words as the index was (website/course-zh-split.js, Sphinx's
      `js_splitter_code`): Sphinx splits a query only at spaces, so 混合精度 typed as Chinese
      is typed, without spaces, found nothing of what 混合 精度 finds;
    - Sphinx 9.0's Chinese search stems its Latin words with the English stemmer, but its
      language_data.js then asks for a `ChineseStemmer` that does not exist: the search page
      stops with "ChineseStemmer is not defined" and finds nothing. The same language, naming
      the stemmer it ships, repairs it (and does nothing where Sphinx has it right)."""
    from sphinx.search.zh import SearchChinese

    stemmer_name = ("English" if SearchChinese.js_stemmer_rawcode == "english-stemmer.js"
                    and SearchChinese.language_name != "English" else SearchChinese.language_name)

    class CourseSearchChinese(SearchChinese):
        language_name = stemmer_name   # what the JS names its stemmer: EnglishStemmer
        js_splitter_code = (Path(__file__).parent / "course-zh-split.js").read_text(encoding="utf-8")

    app.add_search_language(CourseSearchChinese)


def _one_viewport(app, pagename, templatename, context, doctree):
    """Sphinx's layout writes the page's viewport meta tag; another came in `metatags` (and a
    third in the theme's extrahead: website/_templates/layout.html): leave one."""
    import re

    if context.get("metatags"):
        context["metatags"] = re.sub(r'\s*<meta name="viewport"[^>]*>', "", context["metatags"])


def setup(app):
    app.connect("html-page-context", _language_switch)
    app.connect("html-page-context", _one_viewport)
    _chinese_search(app)
