"""The chapter author's tools: notebook building blocks (authoring), `make.py new-chapter`,
`author-check`, `release`, `links` and `cheatsheet`, the fixture submissions and their
grouping, recorded GPU outputs, and a scratch nbgrader course to grade them in."""
