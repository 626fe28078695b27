"""The README and docs/: short enough to read, and every relative link leads somewhere."""

import pathlib
import re

import pytest

from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def anchors(page: pathlib.Path):
    """The anchors GitHub makes of a page's headings."""
    found, fenced = set(), False
    for line in page.read_text().splitlines():
        fenced ^= line.startswith("```")
        if line.startswith("#") and not fenced:
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return found


def test_readme_is_short():
    assert len((REPO / "README.md").read_text().splitlines()) < 150


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    for match in LINK.finditer(page.read_text()):
        target = match.group("target")
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{page.name}: {target} does not exist"
        if anchor and resolved.suffix == ".md":
            assert anchor in anchors(resolved), f"{page.name}: {target} names no heading of {resolved.name}"
