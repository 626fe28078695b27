"""A base's series cut short, for checking it commit by commit (scripts/test --each-commit).

The overlay installs a series from a repository's patches/BASE/; a copy of the repository
whose patches/BASE/ holds only the first patches of the series stands for the tree at one
commit of the stack. The test file at that commit is what the first patches add to it.
"""

import pathlib
import re
import shutil
import subprocess
from typing import List, Optional, Sequence

from torch_overlay import bases, commits

_FILE_DIFF = re.compile(r"^diff --git a/(?P<path>\S+) b/", re.M)
# The files of a patch that hold tests: this repository's, and upstream's in torch.testing.
TEST_PATHS = ("test/", "torch/testing/")
# Starts the ranks of the test file's cases as the suites start them (from a forkserver).
CONFTEST = (
    pathlib.Path(__file__).resolve().parents[1] / "test" / "distributed" / "conftest.py"
)


def list_patches(repo: pathlib.Path, base: bases.Base) -> List[pathlib.Path]:
    return commits.list_patches(base.patches(repo))


def list_changed_paths(patch: pathlib.Path) -> List[str]:
    return [m.group("path") for m in _FILE_DIFF.finditer(patch.read_text())]


def keep_test_hunks(patch: pathlib.Path) -> str:
    """Return ``patch`` with only the diffs of its test files: what "its parent plus its own tests" applies."""
    text = patch.read_text()
    starts = [m.start() for m in _FILE_DIFF.finditer(text)]
    parts = [text[i:j] for i, j in zip([0] + starts, starts + [len(text)])]
    kept = [p for p in parts[1:] if _FILE_DIFF.match(p).group("path").startswith(TEST_PATHS)]  # type: ignore[union-attr]
    return parts[0] + "".join(kept)


def write_series(
    repo: pathlib.Path,
    base: bases.Base,
    series: Sequence[pathlib.Path],
    last_tests_only: bool,
) -> None:
    """Make ``repo``'s patches/BASE/ hold ``series``, the last of them cut to its test hunks if asked."""
    target = base.patches(repo)
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for i, patch in enumerate(series):
        text = (
            keep_test_hunks(patch)
            if last_tests_only and i == len(series) - 1
            else patch.read_text()
        )
        (target / patch.name).write_text(text)


def write_test_file(
    series: Sequence[pathlib.Path], tree: pathlib.Path
) -> Optional[pathlib.Path]:
    """Apply the test/distributed hunks of ``series`` in ``tree``; returns the test file they build.

    None where no patch of ``series`` adds it yet: the v2.1.2 series' first commit, which
    backports upstream's API, has none. The file gets this repository's conftest.py beside
    it, so that pytest starts its ranks as in the suites.
    """
    tree.mkdir(parents=True, exist_ok=True)
    for patch in series:
        subprocess.run(
            ["git", "apply", "--include=test/distributed/*", str(patch)],
            cwd=tree,
            check=True,
        )
    test_file = tree / bases.TEST_FILE
    if not test_file.exists():
        return None
    shutil.copy(CONFTEST, test_file.parent)
    return test_file
