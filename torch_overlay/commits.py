"""Name the commits of a patch series by their subjects, which survive a reordered stack.

A patch's file name carries its place in the series (``0004-...``), which changes
whenever the stack is reordered or a commit is split; its subject does not. The
mutants, the bases' fixes, CI and the docs name commits by subject, and this
module finds the patch that has one. Plain Python: the scripts use it before a
venv exists.
"""

import difflib
import email.parser
import email.policy
import pathlib
import re
from typing import List

# What git format-patch puts before the commit's own subject.
_NUMBERING = re.compile(r"^\[PATCH[^\]]*\]\s*")


class UnknownCommit(Exception):
    """No patch of the series has the subject named; the message says which are close."""


def read_subject(patch: pathlib.Path) -> str:
    """Return the commit subject of ``patch``, a ``git format-patch`` file, unfolded and unnumbered."""
    with open(patch, "rb") as f:
        headers = email.parser.BytesHeaderParser(policy=email.policy.default).parse(f)
    if headers["Subject"] is None:
        raise UnknownCommit(
            f"{patch} has no Subject header: it is not a git format-patch file"
        )
    return _NUMBERING.sub("", str(headers["Subject"]))


def list_patches(patches_dir: pathlib.Path) -> List[pathlib.Path]:
    """Return the series in ``patches_dir``, in order."""
    return sorted(patches_dir.glob("*.patch"))


def list_subjects(patches_dir: pathlib.Path) -> List[str]:
    """Return the subjects of the series in ``patches_dir``, in order."""
    return [read_subject(p) for p in list_patches(patches_dir)]


def find_patch(patches_dir: pathlib.Path, subject: str) -> pathlib.Path:
    """Return the patch of the series in ``patches_dir`` whose subject is ``subject``.

    Raises:
        UnknownCommit: no patch, or more than one, has that subject.
    """
    patches = list_patches(patches_dir)
    found = [p for p in patches if read_subject(p) == subject]
    if len(found) == 1:
        return found[0]
    if found:
        raise UnknownCommit(
            f"{len(found)} patches in {patches_dir} have the subject {subject!r}"
        )
    close = difflib.get_close_matches(
        subject, [read_subject(p) for p in patches], n=1, cutoff=0.5
    )
    hint = f"; the closest is {close[0]!r}" if close else ""
    raise UnknownCommit(f"no patch in {patches_dir} has the subject {subject!r}{hint}")


def list_patches_through(patches_dir: pathlib.Path, subject: str) -> List[pathlib.Path]:
    """Return the series in ``patches_dir`` from its first patch up to the one whose subject is ``subject``."""
    last = find_patch(patches_dir, subject)
    patches = list_patches(patches_dir)
    return patches[: patches.index(last) + 1]
