"""Every relative link in the README and docs/ resolves.

Specification:
- every Markdown link ``[text](target)`` outside code in ``README.md`` and ``docs/*.md`` whose target is not
  a URL (``http:``, ``https:``, ``mailto:``) names a file or folder that exists, relative to the
  page that holds it;
- a ``#anchor`` on such a link (or on its own, for the same page) names a heading of the target
  page, slugged as GitHub slugs headings;
- a link planted broken is reported with its page, its line and its target.
"""

from __future__ import annotations

import re
from pathlib import Path

from harness.launch.run_matrix import layout_table_markdown
from harness.registry import paths

LINK = re.compile(r"(?<!\\)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`]*`")


def pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, fenced = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def broken_links(files: list[Path]) -> list[str]:
    found = []
    for page in files:
        fenced = False
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if fenced:
                continue
            for target in LINK.findall(CODE_SPAN.sub("", line)):
                if re.match(r"[a-z]+:", target):
                    continue
                path, _, anchor = target.partition("#")
                resolved = (page.parent / path).resolve() if path else page
                where = f"{page.name}:{number}: {target}"
                if not resolved.exists():
                    found.append(f"{where}: no such file {resolved}")
                elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                    found.append(f"{where}: no heading #{anchor} in {resolved.name}")
    return found


def test_every_relative_link_in_the_readme_and_docs_resolves():
    found = broken_links(pages(paths.REPO_ROOT))
    assert not found, "\n".join(found)


def test_a_broken_link_is_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Its part\n")
    (tmp_path / "README.md").write_text(
        "# R\n\n[fine](docs/a.md#its-part) [here](#r)\n[gone](docs/b.md)\n"
        "[no anchor](docs/a.md#elsewhere) `f(**[x](y))`\n```\n[in code](nowhere.md)\n```\n")
    found = broken_links(pages(tmp_path))
    assert len(found) == 2, found
    assert found[0].startswith("README.md:4: docs/b.md: no such file"), found
    assert found[1] == "README.md:5: docs/a.md#elsewhere: no heading #elsewhere in a.md", found


LAYOUT_TABLE = re.compile(r"<!-- layout-table[^>]*-->\n(.*?)\n<!-- /layout-table -->", re.S)


def test_the_readmes_layout_table_is_the_registrys():
    found = LAYOUT_TABLE.search((paths.REPO_ROOT / "README.md").read_text())
    assert found, "README.md has no <!-- layout-table --> block"
    assert found.group(1) == layout_table_markdown(), (
        "README.md's layout table is not the registry's: regenerate it with "
        "python3 -c 'from harness.launch.run_matrix import layout_table_markdown as t; print(t())'")
