// A lesson's figures: numbered, described, and enlarged on a tap.
//
// A figure is a cell's image output (myst-nb: `div.cell_output > img`), whose alt text was its
// file's path and which a phone showed 358 px wide with 4-6 px labels. This script gives each
// one, in page order, a numbered caption ("Figure 2" / "图 2") and, for its alt text, the
// caption's words: the first sentence of the paragraph that follows the cell, the lesson's own
// description of it. A tap or a click (or Enter) opens it in a dialog at its full size,
// scrolled inside the dialog on a small screen; a tap, Escape or the close button closes it.
// Nothing is fetched: the dialog shows the same image.
(() => {
  "use strict";
  const zh = () => (document.documentElement.lang || "").toLowerCase().startsWith("zh");
  const words = () => zh()
    ? { figure: (n) => `图 ${n}`, open: "点按放大", close: "关闭", sep: "：" }
    : { figure: (n) => `Figure ${n}`, open: "Click or tap to enlarge", close: "Close", sep: ". " };

  // The first sentence of the paragraph after the figure's cell, if the lesson goes on with one.
  const description = (cell) => {
    let next = cell.nextElementSibling;
    while (next && !next.matches("p, section, h1, h2, h3, h4, div.cell")) next = next.nextElementSibling;
    if (!next || !next.matches("p")) return "";
    const text = next.innerText.replace(/\s+/g, " ").trim();
    const end = text.search(/(?<=[.!?])\s|(?<=[。！？])/);
    return (end > 0 ? text.slice(0, end) : text).trim();
  };

  let dialog = null;
  const enlarge = (img) => {
    const w = words();
    if (!dialog) {
      dialog = document.createElement("dialog");
      dialog.className = "course-figure-dialog";
      dialog.innerHTML = '<form method="dialog"><button class="course-figure-close" type="submit"></button></form>' +
        '<div class="course-figure-scroll"><img alt=""></div><p class="course-figure-caption"></p>';
      dialog.addEventListener("click", (e) => { if (!e.target.closest(".course-figure-scroll")) dialog.close(); });
      dialog.querySelector(".course-figure-scroll").addEventListener("click", () => dialog.close());
      document.body.appendChild(dialog);
    }
    dialog.querySelector(".course-figure-close").textContent = `✕ ${w.close}`;
    const big = dialog.querySelector("img");
    big.src = img.currentSrc || img.src;
    big.alt = img.alt;
    dialog.querySelector(".course-figure-caption").textContent = img.closest("figure")?.querySelector("figcaption")?.textContent || "";
    dialog.showModal();
  };

  const start = () => {
    const w = words();
    const images = document.querySelectorAll("article div.cell_output > img, article div.cell_output > figure.course-figure > img");
    images.forEach((img, i) => {
      if (img.dataset.courseFigure) return;
      const cell = img.closest("div.cell");
      const said = cell ? description(cell) : "";
      const figure = document.createElement("figure");
      figure.className = "course-figure";
      img.replaceWith(figure);
      figure.appendChild(img);
      const caption = figure.appendChild(document.createElement("figcaption"));
      const label = caption.appendChild(document.createElement("span"));
      label.className = "course-figure-number";
      label.textContent = w.figure(i + 1);
      if (said) caption.append(w.sep + said);
      img.alt = said ? `${w.figure(i + 1)}${w.sep}${said}` : w.figure(i + 1);
      img.dataset.courseFigure = String(i + 1);
      img.tabIndex = 0;
      img.setAttribute("role", "button");
      img.title = w.open;
      img.addEventListener("click", () => enlarge(img));
      img.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); enlarge(img); } });
    });
  };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
