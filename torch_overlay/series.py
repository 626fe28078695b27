"""Read the patch series and sort what it changes into what the overlay does with it.

The overlay carries a patch series onto a released wheel, which has some of the
files the series touches (Python sources, ``.pyi`` stubs, headers) but not the
C++ sources. Every file in the series falls into exactly one of these roles:

* ``applied``: the wheel ships the file, so its hunks are applied to the
  installed copy with ``git apply``;
* ``compiled``: ``reducer.cpp`` and ``logger.cpp``. The series must only add
  to them: a hunk may change lines that an earlier patch added, but no line of
  the base file. The lines the series adds are compiled into an extension
  against the wheel's headers;
* ``bound``: ``init.cpp``. The wheel's bindings cannot be rebuilt, so the
  overlay's hand-written ``bindings.cpp`` stands in for its hunks, and must bind
  exactly the Reducer and Logger methods the hunks add;
* ``tests``: files under ``test/``, which this repository runs from its own
  ``test/`` directory.
"""

import dataclasses
import hashlib
import pathlib
import re
from typing import Dict, List, Optional

import unidiff

REDUCER_CPP = "torch/csrc/distributed/c10d/reducer.cpp"
LOGGER_CPP = "torch/csrc/distributed/c10d/logger.cpp"
COMPILED = (REDUCER_CPP, LOGGER_CPP)
INIT_CPP = "torch/csrc/distributed/c10d/init.cpp"
# The files the series changes that the wheel does not ship.
SOURCE_ONLY = COMPILED + (INIT_CPP,)
HEADER_SUFFIXES = (".h", ".hpp")

# A binding added to the Reducer or Logger class in init.cpp: `.def(\n "_name",`.
_DEF_NAME = re.compile(r'^\s*"(?P<name>[A-Za-z_][A-Za-z0-9_]*)",\s*$')
_DEF_OPEN = re.compile(r"^\s*\.def\(\s*$")


class SeriesError(Exception):
    """The series cannot be carried by the overlay; the message says why."""


@dataclasses.dataclass(frozen=True)
class Fragment:
    """A run of lines that one hunk adds to a compiled file."""

    patch: str
    path: str
    first_line: int  # line number in the file that the whole series patches
    text: str


@dataclasses.dataclass
class Series:
    patches: List[pathlib.Path]
    applied: List[str]  # repo paths whose installed copies get patched
    fragments: List[Fragment]  # what the series adds to reducer.cpp and logger.cpp, in file order
    bound_methods: List[str]  # Reducer and Logger methods the init.cpp hunks bind
    # What the hunks show of the base files of SOURCE_ONLY: path -> line number -> text.
    base_lines: Dict[str, Dict[int, str]]

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


@dataclasses.dataclass(frozen=True)
class _KnownLine:
    """A line of a source-only file that the series' hunks show."""

    text: str
    patch: Optional[str]  # the patch that added it; None for a line of the base file
    base_line: Optional[int] = None  # its line number in the base file, if it is one


def _apply_hunks(
    patch_name: str, patched_file: unidiff.PatchedFile, known: Dict[int, _KnownLine]
) -> Dict[int, _KnownLine]:
    """The lines known after ``patched_file``, by line number, from those known before it.

    The base file is not at hand, so only the lines the hunks show are known. A
    hunk may remove lines that an earlier patch of the series added, which keeps
    the series additive as a whole, but not lines of the base file.
    """
    after: Dict[int, _KnownLine] = {}
    hunks = sorted(patched_file, key=lambda h: h.source_start)
    for line_no, known_line in known.items():
        if any(h.source_start <= line_no < h.source_start + h.source_length for h in hunks):
            continue  # the hunk that covers it says what becomes of it
        shift = sum(
            h.target_length - h.source_length for h in hunks if h.source_start + h.source_length <= line_no
        )
        after[line_no + shift] = known_line
    for hunk in hunks:
        for line in hunk:
            if line.is_removed:
                assert line.source_line_no is not None  # removed lines have one
                removed = known.get(line.source_line_no)
                if removed is None or removed.patch is None:
                    raise SeriesError(
                        f"{patch_name}: a hunk at {patched_file.path}:{hunk.source_start} removes "
                        f"line {line.source_line_no}, a line of the base file. The overlay carries only "
                        f"additions to {', '.join(SOURCE_ONLY)}, because the wheel does not ship "
                        "them; keep C++ changes additive (new member functions only)."
                    )
            elif line.is_added:
                assert line.target_line_no is not None  # added lines have one
                after[line.target_line_no] = _KnownLine(line.value, patch_name)
            else:
                assert line.source_line_no is not None and line.target_line_no is not None
                # Every line the series added before it is known, and only those
                # moved it away from where it is in the base file.
                added_before = sum(1 for n, k in known.items() if k.patch and n < line.source_line_no)
                base = _KnownLine(line.value, None, line.source_line_no - added_before)
                before = known.get(line.source_line_no, base)
                if before.text != line.value:
                    raise SeriesError(
                        f"{patch_name}: a hunk at {patched_file.path}:{hunk.source_start} does not "
                        "fit the lines that the patches before it leave there"
                    )
                after[line.target_line_no] = before
    return after


def _fragments(path: str, known: Dict[int, _KnownLine]) -> List[Fragment]:
    """The runs of consecutive lines that the series added, each from one patch."""
    fragments: List[Fragment] = []
    for line_no in sorted(known):
        line = known[line_no]
        if line.patch is None:
            continue
        last = fragments[-1] if fragments else None
        if last and last.patch == line.patch and last.first_line + last.text.count("\n") == line_no:
            fragments[-1] = dataclasses.replace(last, text=last.text + line.text)
        else:
            fragments.append(Fragment(patch=line.patch, path=path, first_line=line_no, text=line.text))
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
        SeriesError: a file of the series fits no role, or a hunk of a file
            the wheel does not ship removes a line of the base file.
    """
    patches = patch_files(patches_dir)
    applied: List[str] = []
    known: Dict[str, Dict[int, _KnownLine]] = {path: {} for path in SOURCE_ONLY}
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
            if path in SOURCE_ONLY:
                known[path] = _apply_hunks(patch.name, patched_file, known[path])
                if path == INIT_CPP:
                    bound.extend(_bound_methods(patched_file))
            elif (site_packages / installed_path(path)).is_file():
                if path not in applied:
                    applied.append(path)
            else:
                raise SeriesError(
                    f"{patch.name}: changes {path}, which the wheel does not ship and "
                    "the overlay cannot build. The overlay carries Python files, stubs "
                    f"and headers the wheel ships, additions to {' and '.join(COMPILED)}, and "
                    f"bindings in {INIT_CPP}."
                )
    fragments = [f for path in COMPILED for f in _fragments(path, known[path])]
    base_lines = {
        path: {k.base_line: k.text for k in lines.values() if k.base_line is not None}
        for path, lines in known.items()
    }
    return Series(patches=patches, applied=applied, fragments=fragments, bound_methods=bound, base_lines=base_lines)
