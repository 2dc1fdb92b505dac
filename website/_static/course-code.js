// A wrapped code line reads as the continuation it is, not as a new statement.
//
// Code blocks wrap their long lines (course.css: nothing is cut off on a phone), and a wrapped
// line used to start at column 0, where it read as a new line of code. This script puts each
// line of a code block in its own span (`span.course-line`, inline-block, full width) with a
// hanging indent: the line's own indentation plus 4 columns (`--course-indent`, course.css), so
// a wrapped part starts to the right of the line it continues. The newlines stay as text
// between the spans, so a copy (sphinx-copybutton's, a selection) is the code as it was.
(() => {
  "use strict";
  const SELECTOR = "div.highlight pre";

  // Pygments' HTML is flat: text and <span class="..">text</span>; a token spanning lines (a
  // docstring) is one span holding newlines. Cut it at each newline, reopening the span.
  const lines = (html) => {
    const out = [""];
    let open = null;
    for (const m of html.matchAll(/(<span\b[^>]*>)|(<\/span>)|([^<]+)|(<[^>]*>)/g)) {
      if (m[1]) { open = m[1]; out[out.length - 1] += m[1]; }
      else if (m[2]) { open = null; out[out.length - 1] += m[2]; }
      else if (m[3]) {
        const parts = m[3].split("\n");
        parts.forEach((part, i) => {
          if (i > 0) {
            if (open) out[out.length - 1] += "</span>";
            out.push(open || "");
          }
          out[out.length - 1] += part;
        });
      } else out[out.length - 1] += m[4];
    }
    return out;
  };

  const indentOf = (html) => {
    const text = html.replace(/<[^>]*>/g, "").replace(/&nbsp;/g, " ");
    return text.length - text.trimStart().length;
  };

  const hang = (pre) => {
    if (pre.dataset.courseLines || pre.querySelector("span.course-line")) return;
    const parts = lines(pre.innerHTML);
    const last = parts.length - 1;
    pre.innerHTML = parts.map((line, i) => {
      if (i === last && line.replace(/<[^>]*>/g, "") === "") return line;   // after the final newline
      return `<span class="course-line" style="--course-indent:${indentOf(line)}ch">${line}</span>`;
    }).join("\n");
    pre.dataset.courseLines = String(parts.length);
  };

  const start = () => document.querySelectorAll(SELECTOR).forEach(hang);
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
