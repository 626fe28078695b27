"""The README and docs/: short enough to read, every relative link leads somewhere, and
every commit they name is a commit of a series, named by its subject."""

import pathlib
import re

import pytest

from conftest import REPO
from torch_overlay import bases, commits

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# What names commits besides the pages: CI's comments and the mutant files' comments.
NAMING_COMMITS = PAGES + [
    REPO / ".ci" / "run",
    *sorted((REPO / "test" / "mutants").glob("*.toml")),
]
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
# A commit named by its subject, in backticks: `[c10d] Reducer::reset_state(): ...`.
SUBJECT = re.compile(r"`(?P<subject>\[[A-Za-z0-9_]+\] [^`]+)`")
# A commit named by its place in a series ("0004", "0011 to 0018"), which a reordered
# stack makes wrong; a patch's file name in a link is checked by the links' test.
PATCH_NUMBER = re.compile(r"(?<![\w.:/-])0\d{3}(?![\w.:])")


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
            assert anchor in anchors(
                resolved
            ), f"{page.name}: {target} names no heading of {resolved.name}"


def all_subjects():
    return {
        subject
        for base in bases.BASES.values()
        for subject in commits.list_subjects(base.patches(REPO))
    }


@pytest.mark.parametrize("page", NAMING_COMMITS, ids=lambda p: p.name)
def test_every_commit_named_is_a_commit_of_a_series(page):
    known = all_subjects()
    named = {
        " ".join(m.group("subject").split()) for m in SUBJECT.finditer(page.read_text())
    }
    assert sorted(named - known) == []


@pytest.mark.parametrize("page", NAMING_COMMITS, ids=lambda p: p.name)
def test_commits_are_named_by_subject_not_by_number(page):
    numbers = [
        f"{i}: {line.strip()}"
        for i, line in enumerate(page.read_text().splitlines(), 1)
        if PATCH_NUMBER.search(line) and not line.startswith(("Date:", "From "))
    ]
    assert numbers == []
