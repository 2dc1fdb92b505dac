// A pasted error message finds its row of the cheat sheet, first of the search results.
//
// Sphinx's search (searchtools.js) ranks pages word by word, so a pasted message ("Expected
// all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!")
// ranks the page that explains it low, and links to the top of that page. This script, loaded
// on every page and acting only on the search page, reads the cheat sheet's error index
// (_static/course-errors.json, written by the site build from CHEATSHEET.md's Errors table:
// coursetools/publish/site_search.py) and lists the rows whose message the query holds, each
// linked to its row, above Sphinx's own results. Nothing leaves the site: the index is a file
// of the edition the page belongs to (the English site's, or zh/'s), found next to this script.
(() => {
  "use strict";

  // This script's own URL, read while it runs (document.currentScript is null in callbacks):
  // its folder is the edition's _static/, at any depth of the page and under zh/ alike.
  const self = document.currentScript ||
    document.querySelector('script[src*="course-search.js"]');
  const staticBase = () => {
    if (self && self.src) return new URL(".", self.src);
    const root = document.documentElement.dataset.content_root || "";
    return new URL(root + "_static/", window.location.href);
  };

  const MIN_SEGMENT = 3;          // a message part shorter than this (compact) is not matched
  const MIN_QUERY_WORDS = 3;      // a query this long (words or characters) may be a part of a
  const MIN_QUERY_CHARS = 15;     // message: "to be on the same device"
  const MAX_HITS = 5;

  // One spelling of every quote (curly quotes from a chat or a document, backquotes from
  // markdown, double quotes where Python prints single ones), lowercase, single spaces.
  const normalize = (text) =>
    text
      .replace(/[\u2018\u2019\u201A\u201B\u2032\u00B4`"\u201C\u201D\u201E\u201F\u2033\u00AB\u00BB]/g, "'")
      .replace(/\u2026/g, "...")
      .toLowerCase()
      .replace(/\s+/g, " ")
      .trim();
  // Without any whitespace: a pasted message whose line breaks were dropped (a search field
  // is one line) or turned into spaces matches alike.
  const compact = (text) => text.replace(/\s+/g, "");

  // The message a pasted traceback ends with: the text after its last "SomeError:" (or
  // "torch.OutOfMemoryError:", "Warning:"), without the traceback's "File ..., line N" noise.
  const exceptionText = (query) => {
    const re = /(?:^|[\s>)\]:])(?:[a-z_][\w.]*\.)?[a-z_]\w*(?:error|exception|warning)\s*:\s*/gi;
    let last = -1;
    for (const m of query.matchAll(re)) last = m.index + m[0].length;
    return last >= 0 ? query.slice(last) : query;
  };

  // The parts of a cheat sheet message that a real message holds, in order: its " / "
  // alternatives, each cut at "...".
  const alternatives = (message) =>
    normalize(message)
      .split(" / ")
      .map((alt) => alt.split("...").map(compact).filter((s) => s.length >= MIN_SEGMENT))
      .filter((segments) => segments.length > 0);

  // How well `query` matches `entry`: the length of the message text it matched, 0 for none.
  // A row matches when the query holds every part of one of its alternatives, in order, or
  // when a query long enough is itself a part of the message.
  const score = (entry, queryCompact, askedCompact, queryWords) => {
    let best = 0;
    for (const segments of alternatives(entry.message)) {
      let at = 0, ok = true, length = 0;
      for (const segment of segments) {
        const found = queryCompact.indexOf(segment, at);
        if (found < 0) { ok = false; break; }
        at = found + segment.length;
        length += segment.length;
      }
      if (ok) best = Math.max(best, length);
    }
    const whole = compact(normalize(entry.message).replace(/\.\.\./g, " "));
    if ((queryWords >= MIN_QUERY_WORDS || askedCompact.length >= MIN_QUERY_CHARS) &&
        askedCompact.length >= MIN_SEGMENT && whole.includes(askedCompact))
      best = Math.max(best, askedCompact.length);
    return best;
  };

  const matches = (entries, query) => {
    const q = normalize(query);
    const qCompact = compact(q);
    const message = exceptionText(q).replace(/^['\s]+|['\s.!]+$/g, "");
    const words = message.split(" ").filter((w) => w).length;
    return entries
      .map((entry, order) => ({ entry, order, score: score(entry, qCompact, compact(message), words) }))
      .filter((m) => m.score > 0)
      .sort((a, b) => b.score - a.score || a.order - b.order)
      .slice(0, MAX_HITS)
      .map((m) => m.entry);
  };

  const zh = () => (document.documentElement.lang || "").toLowerCase().startsWith("zh");
  const words = () => zh()
    ? { lead: "速查表 · 报错：", chapter: (n) => `第 ${n} 章`, chapters: "讲解：", sep: "、" }
    : { lead: "Cheat sheet, errors: ", chapter: (n) => `chapter ${n}`, chapters: "Explained in ", sep: ", " };

  // The results, as Sphinx draws its own (ul.search, li, a, p.context): the theme's search
  // styles apply to them.
  const render = (hits, base) => {
    const w = words();
    const list = document.createElement("ul");
    list.className = "search course-error-hits";
    list.setAttribute("role", "list");
    for (const hit of hits) {
      const item = list.appendChild(document.createElement("li"));
      item.className = "kind-text course-error-hit";
      const link = item.appendChild(document.createElement("a"));
      link.href = new URL(hit.url, base).href;
      link.textContent = hit.message;
      const context = item.appendChild(document.createElement("p"));
      context.className = "context";
      context.textContent = w.lead + hit.cause;
      if (hit.chapters && hit.chapters.length) {
        // A span, not p.context: the theme puts a "#" before each link of p.context.
        const chapters = item.appendChild(document.createElement("span"));
        chapters.className = "course-error-chapters";
        chapters.append(w.chapters);
        // Each goes to the section that explains the message: {label: "08 §2 row 4", url}.
        hit.chapters.forEach((where, i) => {
          if (i) chapters.append(w.sep);
          const a = chapters.appendChild(document.createElement("a"));
          a.href = new URL(where.url, base).href;
          const m = where.label.match(/^(\d+)\s*(.*)$/);
          a.textContent = m ? w.chapter(m[1]) + (m[2] ? " " + m[2] : "") : where.label;
        });
      }
    }
    return list;
  };

  // Our list goes first in #search-results, right before Sphinx's ul.search once Sphinx made
  // it (searchtools.js adds its heading, summary and list when it starts, possibly after us),
  // and stays there whenever Sphinx adds its elements.
  const place = (out, list) => {
    const keep = () => {
      const theirs = out.querySelector(":scope > ul.search:not(.course-error-hits)");
      if (theirs) {
        if (list.nextElementSibling !== theirs) out.insertBefore(list, theirs);
      } else if (list.parentNode !== out) {
        out.prepend(list);
      }
    };
    keep();
    new MutationObserver(keep).observe(out, { childList: true });
  };

  const run = () => {
    const out = document.getElementById("search-results");
    if (!out) return;
    const query = new URLSearchParams(window.location.search).get("q") || "";
    if (!query.trim()) return;
    const base = staticBase();
    fetch(new URL("course-errors.json", base))
      .then((response) => (response.ok ? response.json() : []))
      .then((entries) => {
        const hits = matches(Array.isArray(entries) ? entries : [], query);
        if (!hits.length) return;
        place(out, render(hits, new URL("..", base)));
        document.documentElement.dataset.courseErrorHits = String(hits.length);
      })
      .catch(() => {});     // no index (a build without the cheat sheet): Sphinx's results only
  };

  // Sphinx's excerpts are the page's text around the match: without this, the excerpt of a
  // page shows the theme's print-only table of contents ("Contents 1. How to ...") that
  // sphinx-book-theme puts inside the article. The excerpt is taken from the text without it.
  // (and myst-nb's "Show code cell source / Hide code cell source" toggle labels).
  const PRINT_ONLY = ".onlyprint, #jb-print-docs-body, details.hide > summary";
  const cleanExcerpts = () => {
    // (searchtools.js declares `const Search` at the top level: a global binding, not a window property)
    // eslint-disable-next-line no-undef
    const search = typeof Search !== "undefined" ? Search : window.Search;
    if (!search || typeof search.htmlToText !== "function" || search.htmlToText.courseClean) return;
    const original = search.htmlToText;
    const cleaned = (htmlString, anchor) => {
      const doc = new DOMParser().parseFromString(htmlString, "text/html");
      doc.querySelectorAll(PRINT_ONLY).forEach((el) => el.remove());
      return original(doc.documentElement.outerHTML, anchor);
    };
    cleaned.courseClean = true;
    search.htmlToText = cleaned;
  };

  const start = () => {
    cleanExcerpts();
    run();
  };
  cleanExcerpts();
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
