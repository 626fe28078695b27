"""Read the patch series and sort what it changes into what the overlay does with it.

The overlay carries a patch series onto a released wheel, which has some of the
files the series touches (Python sources, ``.pyi`` stubs, headers) but not the
C++ sources. Every file in the series falls into exactly one of these roles:

* ``applied``: the wheel ships the file, so its hunks are applied to the
  installed copy with ``git apply``;
* ``compiled``: ``reducer.cpp``. Its hunks must be pure additions; the added
  lines are compiled into an extension against the wheel's headers;
* ``bound``: ``init.cpp``. The wheel's bindings cannot be rebuilt, so the
  overlay's hand-written ``bindings.cpp`` stands in for its hunk, and must bind
  exactly the methods the hunk adds;
* ``tests``: files under ``test/``, which this repository runs from its own
  ``test/`` directory.
"""

import dataclasses
import hashlib
import pathlib
import re
from typing import List

import unidiff

REDUCER_CPP = "torch/csrc/distributed/c10d/reducer.cpp"
INIT_CPP = "torch/csrc/distributed/c10d/init.cpp"
HEADER_SUFFIXES = (".h", ".hpp")

# A binding added to the Reducer class in init.cpp: `.def(\n "_name",`.
_DEF_NAME = re.compile(r'^\s*"(?P<name>[A-Za-z_][A-Za-z0-9_]*)",\s*$')
_DEF_OPEN = re.compile(r"^\s*\.def\(\s*$")


class SeriesError(Exception):
    """The series cannot be carried by the overlay; the message says why."""


@dataclasses.dataclass(frozen=True)
class Fragment:
    """A run of lines that one hunk adds to a compiled file."""

    patch: str
    path: str
    first_line: int  # line number in the patched file
    text: str


@dataclasses.dataclass
class Series:
    patches: List[pathlib.Path]
    applied: List[str]  # repo paths whose installed copies get patched
    fragments: List[Fragment]  # reducer.cpp additions, in series order
    bound_methods: List[str]  # Reducer methods the init.cpp hunks bind

    def digest(self) -> str:
        h = hashlib.sha256()
        for p in self.patches:
            h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
        return h.hexdigest()


def patch_files(patches_dir: pathlib.Path) -> List[pathlib.Path]:
    patches = sorted(patches_dir.glob("*.patch"))
    if not patches:
        raise SeriesError(f"no *.patch files in {patches_dir}")
    return patches


def installed_path(repo_path: str) -> str:
    """Where the wheel installs a file of the source tree, relative to site-packages."""
    if repo_path.endswith(HEADER_SUFFIXES):
        return "torch/include/" + repo_path
    return repo_path


def _target_path(patched_file: unidiff.PatchedFile) -> str:
    return patched_file.target_file[2:] if patched_file.target_file.startswith("b/") else patched_file.path


def _added_fragments(patch_name: str, patched_file: unidiff.PatchedFile) -> List[Fragment]:
    fragments = []
    for hunk in patched_file:
        if hunk.removed:
            raise SeriesError(
                f"{patch_name}: a hunk at {patched_file.path}:{hunk.source_start} removes "
                f"{hunk.removed} line(s). The overlay compiles only additions to "
                f"{REDUCER_CPP}, because the wheel does not ship the file; keep C++ "
                "changes additive (new member functions only)."
            )
        run: List[unidiff.patch.Line] = []
        for line in list(hunk) + [None]:
            if line is not None and line.is_added:
                run.append(line)
                continue
            if run:
                assert run[0].target_line_no is not None  # added lines have one
                fragments.append(
                    Fragment(
                        patch=patch_name,
                        path=patched_file.path,
                        first_line=run[0].target_line_no,
                        text="".join(x.value for x in run),
                    )
                )
                run = []
    return fragments


def _bound_methods(patched_file: unidiff.PatchedFile) -> List[str]:
    names = []
    for hunk in patched_file:
        added = [line.value.rstrip("\n") for line in hunk if line.is_added]
        for opening, name_line in zip(added, added[1:]):
            match = _DEF_NAME.match(name_line)
            if _DEF_OPEN.match(opening) and match:
                names.append(match.group("name"))
    return names


def read_series(patches_dir: pathlib.Path, site_packages: pathlib.Path) -> Series:
    """Parse the series and sort its files into the overlay's roles.

    Args:
        patches_dir: directory holding the ``git format-patch`` files.
        site_packages: the wheel's site-packages, to tell which files it ships.

    Raises:
        SeriesError: a file of the series fits no role, or a ``reducer.cpp``
            hunk is not a pure addition.
    """
    patches = patch_files(patches_dir)
    applied: List[str] = []
    fragments: List[Fragment] = []
    bound: List[str] = []
    for patch in patches:
        try:
            patch_set = unidiff.PatchSet.from_filename(str(patch), encoding="utf-8")
        except unidiff.UnidiffParseError as e:
            raise SeriesError(f"{patch.name}: not a unified diff: {e}") from e
        if not len(patch_set):
            raise SeriesError(f"{patch.name}: changes no file")
        for patched_file in patch_set:
            path = _target_path(patched_file)
            if path.startswith("test/"):
                continue
            if path == REDUCER_CPP:
                fragments.extend(_added_fragments(patch.name, patched_file))
            elif path == INIT_CPP:
                bound.extend(_bound_methods(patched_file))
            elif (site_packages / installed_path(path)).is_file():
                if path not in applied:
                    applied.append(path)
            else:
                raise SeriesError(
                    f"{patch.name}: changes {path}, which the wheel does not ship and "
                    "the overlay cannot build. The overlay carries Python files, stubs "
                    f"and headers the wheel ships, additions to {REDUCER_CPP}, and "
                    f"bindings in {INIT_CPP}."
                )
    return Series(patches=patches, applied=applied, fragments=fragments, bound_methods=bound)
