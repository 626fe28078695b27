"""Read the patch series and sort what it changes into what the overlay does with it.

The overlay carries a patch series onto a released wheel, which has some of the
files the series touches (Python sources, ``.pyi`` stubs, headers) but not the
C++ sources. Every file in the series falls into exactly one of these roles:

* ``applied``: the wheel ships the file, so its hunks are applied to the
  installed copy with ``git apply``. A data member that the series adds to a
  class in a header is left out there, and carried by a shim (see
  :mod:`torch_overlay.cpp_classes`);
* ``compiled``: ``reducer.cpp``, ``logger.cpp`` and ``Backend.cpp``, whose
  functions compile against the wheel's headers. The overlay takes every
  function that the series adds or changes whole from the hunks (see
  :mod:`torch_overlay.cpp_hunks`) and compiles it into an extension; a function
  of libtorch that the series changes is compiled under another name, and
  libtorch's callers reach it through their relocations, or the Python binding
  where its signature changes (see :mod:`torch_overlay.callers`);
* ``prologue``: any other ``.cpp`` file under ``torch/csrc``, which needs
  headers that the wheel lacks (gloo's, NCCL's). The series may only add
  statements at the start of a function there, which the overlay runs before
  libtorch's definition;
* ``bound``: ``init.cpp``. The wheel's bindings cannot be rebuilt, so the
  extension's module binds each method that the hunks bind, new or changed,
  from the hunk's own `.def(` (see :func:`codegen.generate_module`). A hunk may
  change a binding of the base file only where it binds a function that the
  series changes;
* ``tests``: files under ``test/``, which this repository runs from its own
  ``test/`` directory.
"""

import dataclasses
import hashlib
import pathlib
from collections import defaultdict
from typing import Dict, List, Optional, Set

import unidiff

from torch_overlay.cpp_hunks import (
    apply_hunks,
    Binding,
    Declaration,
    find_bindings,
    find_target_path,
    find_whole_changes,
    KnownLine,
    make_prologue,
    Prologue,
    SeriesError,
    WholeFunction,
)

C10D_SOURCES = "torch/csrc/distributed/c10d/"
REDUCER_CPP = C10D_SOURCES + "reducer.cpp"
LOGGER_CPP = C10D_SOURCES + "logger.cpp"
BACKEND_CPP = C10D_SOURCES + "Backend.cpp"
# The sources whose functions compile against the wheel's headers.
COMPILED = (REDUCER_CPP, LOGGER_CPP, BACKEND_CPP)
# The sources whose changed functions the overlay compiles under other names: the
# renames reach the declarations in their headers (see codegen.generate_renames).
RENAMED = (REDUCER_CPP, LOGGER_CPP)
INIT_CPP = C10D_SOURCES + "init.cpp"
HEADER_SUFFIXES = (".h", ".hpp")


@dataclasses.dataclass
class Series:
    """What a patch series changes, sorted into the overlay's roles."""

    patches: List[pathlib.Path]
    # Repo paths whose installed copies get patched.
    applied: List[str]
    # The functions that the series adds to the compiled files, in file order.
    added: List[WholeFunction]
    # The constants that the series adds at namespace scope of the compiled files.
    declarations: List[Declaration]
    # The functions of libtorch that the series changes in the compiled files.
    replaced: List[WholeFunction]
    # The statements that the series adds at the start of functions it cannot compile.
    prologues: List[Prologue]
    # The methods that the init.cpp hunks bind, new or changed.
    bindings: List[Binding]
    # What the hunks show of the base files of the sources: path -> line number -> text.
    base_lines: Dict[str, Dict[int, str]]

    @property
    def bound_methods(self) -> List[str]:
        """Return the names of the methods that the series binds."""
        return [b.name for b in self.bindings]

    def compute_digest(self) -> str:
        """Return a digest of the patches, names and contents."""
        h = hashlib.sha256()
        for p in self.patches:
            h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
        return h.hexdigest()


def list_patch_files(patches_dir: pathlib.Path) -> List[pathlib.Path]:
    patches = sorted(patches_dir.glob("*.patch"))
    if not patches:
        raise SeriesError(f"no *.patch files in {patches_dir}")
    return patches


def find_installed_path(repo_path: str) -> str:
    """Return where the wheel installs a file of the source tree, relative to site-packages."""
    if repo_path.endswith(HEADER_SUFFIXES):
        return "torch/include/" + repo_path
    return repo_path


def is_source_only(path: str) -> bool:
    """Return whether ``path`` is a C++ source of the tree, which no wheel ships."""
    return path.startswith("torch/csrc/") and path.endswith(".cpp")


def read_series(
    patches_dir: pathlib.Path,
    site_packages: pathlib.Path,
    count: Optional[int] = None,
) -> Series:
    """Parse the series and sort its files into the overlay's roles.

    Args:
        patches_dir: directory holding the ``git format-patch`` files.
        site_packages: the wheel's site-packages, to tell which files it ships.
        count: read only the first ``count`` patches, a series cut short.

    Raises:
        SeriesError: a file of the series fits no role, or a hunk of a source the
            wheel lacks changes what the overlay cannot carry (see the roles).
    """
    patches = list_patch_files(patches_dir)[:count]
    applied: List[str] = []
    known: Dict[str, Dict[int, KnownLine]] = defaultdict(dict)
    changed: Dict[str, Set[str]] = defaultdict(set)
    for patch in patches:
        try:
            patch_set = unidiff.PatchSet.from_filename(str(patch), encoding="utf-8")
        except unidiff.UnidiffParseError as e:
            raise SeriesError(f"{patch.name}: not a unified diff: {e}") from e
        if not len(patch_set):
            raise SeriesError(f"{patch.name}: changes no file")
        for patched_file in patch_set:
            path = find_target_path(patched_file)
            if path.startswith("test/"):
                continue
            if is_source_only(path):
                known[path] = apply_hunks(
                    patch.name,
                    patched_file,
                    known[path],
                    changed[path],
                    is_bindings=path == INIT_CPP,
                )
            elif (site_packages / find_installed_path(path)).is_file():
                if path not in applied:
                    applied.append(path)
            else:
                raise SeriesError(
                    f"{patch.name}: changes {path}, which the wheel does not ship and "
                    "the overlay cannot build. The overlay carries Python files, stubs "
                    "and headers the wheel ships, functions of "
                    f"{', '.join(COMPILED)}, statements added at the start of a "
                    f"function of another source, and bindings in {INIT_CPP}."
                )
    added: List[WholeFunction] = []
    declarations: List[Declaration] = []
    replaced: List[WholeFunction] = []
    prologues: List[Prologue] = []
    for path in sorted(known):
        if path == INIT_CPP:
            continue
        functions, path_declarations = find_whole_changes(
            path, known[path], changed[path]
        )
        if path in COMPILED:
            declarations += path_declarations
            added += [f for f in functions if not f.changes_base]
            for function in (f for f in functions if f.changes_base):
                if path not in RENAMED:
                    raise SeriesError(
                        f"{function.patch}: it changes {function.name} of {path}; the "
                        "overlay compiles a changed function of libtorch under another "
                        f"name only in {' and '.join(RENAMED)}"
                    )
                replaced.append(function)
        else:
            if path_declarations:
                raise SeriesError(
                    f"{path_declarations[0].patch}: it adds a constant to {path}, "
                    "which the overlay cannot compile"
                )
            prologues += [make_prologue(f, changed[path]) for f in functions]
    rebound = changed[INIT_CPP] - {r.binding for r in replaced}
    if rebound:
        raise SeriesError(
            f"the series changes the init.cpp bindings {', '.join(sorted(rebound))}, "
            "which bind no function that it changes. The overlay binds a changed "
            "binding anew, which only a function that it compiles can serve."
        )
    base_lines = {
        path: {k.base_line: k.text for k in lines.values() if k.base_line is not None}
        for path, lines in known.items()
    }
    return Series(
        patches=patches,
        applied=applied,
        added=added,
        declarations=declarations,
        replaced=replaced,
        prologues=prologues,
        bindings=find_bindings(known[INIT_CPP], changed[INIT_CPP]),
        base_lines=base_lines,
    )
