// The menu buttons (☰ for the course map, the page-contents button on a phone).
// sphinx-book-theme puts its own `.primary-toggle` in the article header, and
// pydata-sphinx-theme 0.17+ adds another to its navbar. Both themes' scripts bind only the first
// `.primary-toggle` / `.secondary-toggle` on the page (document.querySelector), so the button a
// reader sees did nothing (pydata-sphinx-theme issue 2451). Each other button hands its click to
// the bound one, so the themes' own code runs: on a wide screen sphinx-book-theme collapses the
// sidebar, on a narrow one pydata-sphinx-theme opens the drawer.
document.addEventListener("DOMContentLoaded", () => {
  for (const selector of [".primary-toggle", ".secondary-toggle"]) {
    const [bound, ...others] = document.querySelectorAll(selector);
    for (const button of others) {
      button.addEventListener("click", (event) => {
        event.preventDefault();
        event.stopImmediatePropagation();
        bound.click();
      }, true);
    }
  }
});
