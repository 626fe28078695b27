"""A PyTorch checkout, as scripts/apply, build, submit and test see it.

Everything here asks git. Only am() and reset_author(), which scripts/apply runs on
the branch it creates, change the checkout; trying the series out uses a temporary
index file (``git apply --cached``) or a throwaway worktree.
"""

import dataclasses
import os
import pathlib
import re
import subprocess
import tempfile
from typing import List, Optional

import _common
from torch_overlay import bases

# Files whose presence makes a directory a PyTorch source tree.
MARKERS = (
    "setup.py",
    "version.txt",
    "torch/nn/parallel/distributed.py",
    "torch/csrc/distributed/c10d/reducer.cpp",
)
DDP = "torch/nn/parallel/distributed.py"
# What `git am` says about going on, skipping or aborting, and how to silence that
# advice: scripts/apply has aborted by the time it reports.
AM_HINTS = re.compile(r"git am --(continue|skip|abort|show-current-patch)|advice\.")


def has_the_api(ddp_source: str) -> bool:
    """Tell whether a distributed.py already defines DistributedDataParallel._update_process_group."""
    return "def _update_process_group(" in ddp_source


class CheckoutError(Exception):
    """The checkout cannot be used as asked; the message says why."""


def list_patch_files(base: bases.Base) -> List[pathlib.Path]:
    """Return the series of ``base``, in order."""
    directory = base.patches(_common.REPO)
    patches = sorted(directory.glob("*.patch"))
    if not patches:
        raise CheckoutError(
            f"no patches in {directory}: the {base.name} series is not there"
        )
    return patches


def classify_tree(base: bases.Base, version: str, ddp_source: str) -> str:
    """Tell what a tree at ``version`` whose distributed.py is ``ddp_source`` is to ``base``'s series,
    when the series is not applied: "upstream" (the tree has the API, which the series adds)
    or "base" (the series is for this tree). Raises CheckoutError for any other tree."""
    api = has_the_api(ddp_source)
    if not base.has_api:
        if api:
            return "upstream"
        try:
            base.check(version)
        except bases.UnsupportedTorch as e:
            raise CheckoutError(str(e)) from e
        return "base"
    if not api:
        raise CheckoutError(
            f"version {version} has no DistributedDataParallel._update_process_group of its own: the {base.name} "
            f"series fixes upstream's, on {base.name} or newer; for a tree without it, the series that adds it "
            f"is --base {bases.ADDS_API}"
        )
    try:
        found = bases.parse(version)
    except bases.UnsupportedTorch as e:
        raise CheckoutError(str(e)) from e
    if found < base.release:
        raise CheckoutError(
            f"version {version} is older than {base.name}, which the {base.name} series is kept against: "
            f"check out {base.name} (or a newer release or main) and apply it there"
        )
    return "base"


def git(
    tree: pathlib.Path, *args: str, env: Optional[dict] = None, check: bool = True
) -> subprocess.CompletedProcess:
    result = subprocess.run(
        ["git", "-C", str(tree), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    if check and result.returncode != 0:
        raise CheckoutError(f"git {' '.join(args)} failed: {result.stderr.strip()}")
    return result


@dataclasses.dataclass
class Rejection:
    """Where the series stops applying."""

    patch: str
    file: str
    line: str
    message: str

    def __str__(self) -> str:
        if not self.file:
            return f"{self.patch} does not apply.\n{self.message}"
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{self.patch} does not apply: the hunk at {where} does not match.\n{self.message}"


def parse_rejection(patch: str, output: str) -> Rejection:
    """Name the file and hunk from ``git apply`` or ``git am`` output."""
    match = re.search(r"patch failed: (?P<file>\S+):(?P<line>\d+)", output)
    if match:
        return Rejection(
            patch, match.group("file"), match.group("line"), output.strip()
        )
    match = re.search(r"Merge conflict in (?P<file>\S+)", output) or re.search(
        r"error: (?P<file>\S+): ", output
    )
    return Rejection(patch, match.group("file") if match else "", "", output.strip())


def find_first_rejected_hunk(
    tree: pathlib.Path, patches: List[pathlib.Path]
) -> Optional[Rejection]:
    """Apply the series to HEAD in a throwaway index, without merging: the first hunk that fails."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
        git(tree, "read-tree", "HEAD", env=env)
        for patch in patches:
            result = git(tree, "apply", "--cached", str(patch), env=env, check=False)
            if result.returncode != 0:
                return parse_rejection(patch.name, result.stderr)
    return None


@dataclasses.dataclass
class Checkout:
    path: pathlib.Path

    @classmethod
    def open(cls, path: pathlib.Path) -> "Checkout":
        path = path.resolve()
        if not path.is_dir():
            raise CheckoutError(f"{path} is not a directory")
        if git(path, "rev-parse", "--is-inside-work-tree", check=False).returncode != 0:
            raise CheckoutError(f"{path} is not a git checkout")
        top = pathlib.Path(git(path, "rev-parse", "--show-toplevel").stdout.strip())
        missing = [m for m in MARKERS if not (top / m).is_file()]
        if missing:
            raise CheckoutError(
                f"{top} is not a PyTorch source tree: it has no {', '.join(missing)}"
            )
        return cls(top)

    @property
    def version(self) -> str:
        return (self.path / "version.txt").read_text().strip()

    def read_branch(self) -> Optional[str]:
        """Return the checked-out branch; None on a detached HEAD."""
        result = git(
            self.path, "symbolic-ref", "--quiet", "--short", "HEAD", check=False
        )
        return result.stdout.strip() if result.returncode == 0 else None

    def list_uncommitted_changes(self) -> str:
        """Return ``git status --porcelain`` of the tracked files: empty when there are none."""
        return git(
            self.path, "status", "--porcelain", "--untracked-files=no"
        ).stdout.strip()

    def require_clean(self) -> None:
        dirty = self.list_uncommitted_changes()
        if dirty:
            raise CheckoutError(
                f"{self.path} has uncommitted changes; commit or stash them first:\n{dirty}"
            )

    def list_untracked_in_the_way(self, patches: List[pathlib.Path]) -> List[str]:
        """Return the files the series creates that are already in the work tree, untracked: `git am` stops at them.

        Ignored files are not in the way: git overwrites them.
        """
        summary = git(self.path, "apply", "--summary", *map(str, patches)).stdout
        created = re.findall(r"^ create mode \d+ (.+)$", summary, flags=re.MULTILINE)
        if not created:
            return []
        return git(
            self.path, "ls-files", "--others", "--exclude-standard", "--", *created
        ).stdout.split()

    def is_applied(self, patches: List[pathlib.Path]) -> bool:
        """Tell whether HEAD already has the series: it reverse-applies, tried in a throwaway index."""
        with tempfile.TemporaryDirectory() as tmp:
            env = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
            git(self.path, "read-tree", "HEAD", env=env)
            for patch in reversed(patches):
                if git(
                    self.path,
                    "apply",
                    "--cached",
                    "--reverse",
                    str(patch),
                    env=env,
                    check=False,
                ).returncode:
                    return False
        return True

    def count_applied_patches(self, patches: List[pathlib.Path]) -> int:
        """Count how many of the series' first patches HEAD holds: the longest run from the first that reverse-applies."""
        return next(
            (
                count
                for count in range(len(patches), 0, -1)
                if self.is_applied(patches[:count])
            ),
            0,
        )

    def try_apply(self, patches: List[pathlib.Path]) -> Optional[Rejection]:
        """Apply the series to HEAD exactly as scripts/apply does, in a throwaway worktree."""
        with tempfile.TemporaryDirectory() as tmp:
            worktree = pathlib.Path(tmp) / "worktree"
            git(
                self.path,
                "worktree",
                "add",
                "--detach",
                "--quiet",
                str(worktree),
                "HEAD",
            )
            try:
                return am(worktree, patches)
            finally:
                git(
                    self.path,
                    "worktree",
                    "remove",
                    "--force",
                    str(worktree),
                    check=False,
                )

    def read_state(self, base: bases.Base, patches: List[pathlib.Path]) -> str:
        """Return "applied" (``base``'s series is at HEAD), "partly applied" (its first patches
        are, as :meth:`count_applied_patches` counts), or what :func:`classify_tree` says of the
        tree: "upstream" or "base"; raise CheckoutError for a tree the series is not for.
        """
        applied = self.count_applied_patches(patches)
        if applied == len(patches):
            return "applied"
        if applied:
            # The first patches reverse-apply; the tree must still be one the series is for.
            try:
                if base.has_api:
                    classify_tree(base, self.version, (self.path / DDP).read_text())
                else:
                    base.check(self.version)
            except (CheckoutError, bases.UnsupportedTorch) as e:
                raise CheckoutError(f"{self.path}: {e}") from e
            return "partly applied"
        try:
            return classify_tree(base, self.version, (self.path / DDP).read_text())
        except CheckoutError as e:
            raise CheckoutError(f"{self.path}: {e}") from e


def am(tree: pathlib.Path, patches: List[pathlib.Path]) -> Optional[Rejection]:
    """Apply the series onto ``tree``'s HEAD with ``git am --3way``, keeping subjects such as "[c10d] ...".

    On failure, aborts so that ``tree`` is as it was, and returns where it stopped.
    """
    result = git(
        tree, "am", "--3way", "--keep-non-patch", *map(str, patches), check=False
    )
    if result.returncode == 0:
        return None
    output = "".join(
        line
        for line in (result.stdout + result.stderr).splitlines(True)
        if not AM_HINTS.search(line)
    )
    number = re.search(r"Patch failed at (\d+)", output)
    failed = next(
        (p.name for p in patches if number and p.name.startswith(number.group(1))),
        "the series",
    )
    git(tree, "am", "--abort", check=False)
    rejection = parse_rejection(failed, output)
    # A three-way merge names only the file; the plain apply names the hunk.
    hunk = find_first_rejected_hunk(tree, patches)
    if hunk is not None and hunk.file == rejection.file:
        rejection.line = hunk.line
    return rejection


# Amends a commit to be the user's: its author becomes who `git commit` would record
# now (GIT_AUTHOR_NAME and GIT_AUTHOR_EMAIL, then author.* and user.* config, as git's
# own rules say) at the current time; the message stays byte for byte, and no hook
# runs again on a change that only moves authorship.
RESET_AUTHOR = (
    "git commit --amend --no-edit --no-verify --cleanup=verbatim --reset-author --quiet"
)


def reset_author(tree: pathlib.Path, base: str) -> None:
    """Make the commits ``base..HEAD`` the user's, as ``git commit --amend --reset-author`` does.

    On failure, aborts the rebase so that the branch is as it was, and raises CheckoutError.
    """
    result = git(tree, "rebase", "--quiet", "--exec", RESET_AUTHOR, base, check=False)
    if result.returncode != 0:
        git(tree, "rebase", "--abort", check=False)
        output = (result.stdout + result.stderr).strip()
        raise CheckoutError(
            f"could not make the applied commits yours ({RESET_AUTHOR}):\n{output}"
        )
