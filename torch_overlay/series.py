"""Read the patch series and sort what it changes into what the overlay does with it.

The overlay carries a patch series onto a released wheel, which has some of the
files the series touches (Python sources, ``.pyi`` stubs, headers) but not the
C++ sources. Every file in the series falls into exactly one of these roles:

* ``applied``: the wheel ships the file, so its hunks are applied to the
  installed copy with ``git apply``;
* ``compiled``: ``reducer.cpp`` and ``logger.cpp``. On v2.1.2 the series must
  only add to them: a hunk may change lines that an earlier patch added, but
  no line of the base file. The lines the series adds are compiled into an
  extension against the wheel's headers. On a base whose libtorch already has
  the functions the series changes (v2.14.1), a hunk may also change a
  function of the base file, provided it shows the whole function (the
  series is made with ``git format-patch --function-context``): the overlay
  then compiles the patched definition under another symbol and binds it in
  place of the old one (see :class:`ReplacedFunction`);
* ``bound``: ``init.cpp``. The wheel's bindings cannot be rebuilt, so the
  overlay's hand-written ``bindings.cpp`` stands in for its hunks, and must bind
  exactly the Reducer and Logger methods the hunks add, and the replaced ones.
  A hunk may change a binding of the base file only where it binds a function
  that the series replaces, as ``bindings.cpp`` binds that one anew;
* ``tests``: files under ``test/``, which this repository runs from its own
  ``test/`` directory.
"""

import dataclasses
import hashlib
import pathlib
import re
from typing import Dict, List, Optional, Set, Tuple

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


# A function definition's first line in c10d's C++: at column 0, such as
# "bool Reducer::reset_state() {" or "void Reducer::update_process_group(".
_DEFINITION = re.compile(r"^[A-Za-z_][^;]*\b(?P<name>[A-Za-z_]\w*::~?[A-Za-z_]\w*)\(")
# The closing brace of a function definition, at column 0.
_DEFINITION_END = re.compile(r"^}\s*$")
# The first line of a constant that a series adds at namespace scope.
_CONSTANT = re.compile(r"^(static\s+)?constexpr\s")


class SeriesError(Exception):
    """The series cannot be carried by the overlay; the message says why."""


@dataclasses.dataclass(frozen=True)
class ReplacedFunction:
    """A function of a compiled file's base that the series changes.

    libtorch already defines it, and other code in libtorch could call that
    definition, so the overlay cannot replace it in place. It compiles the
    patched definition under another symbol (``symbol``), and binds that in
    place of the Python binding of the old one: sound only where nothing but
    that binding calls the old one, which the overlay checks in the wheel's
    libraries before it installs (:mod:`torch_overlay.callers`).
    """

    path: str
    name: str  # qualified as in the definition, such as "Reducer::reset_state"
    first_line: int  # line number in the file that the whole series patches
    text: str  # the whole patched definition

    @property
    def member(self) -> str:
        return self.name.split("::")[-1]

    @property
    def binding(self) -> str:
        """The Python binding of the function in torch._C._distributed_c10d, which the overlay replaces."""
        return f"_{self.member}"

    @property
    def symbol(self) -> str:
        """The name the overlay compiles the patched definition under."""
        return f"_overlay_replaced_{self.member}"


@dataclasses.dataclass(frozen=True)
class Fragment:
    """A run of lines that one hunk adds to a compiled file."""

    patch: str
    path: str
    first_line: int  # line number in the file that the whole series patches
    text: str
    declaration: bool = False  # a constant at namespace scope, which functions may use


@dataclasses.dataclass
class Series:
    patches: List[pathlib.Path]
    applied: List[str]  # repo paths whose installed copies get patched
    fragments: List[
        Fragment
    ]  # what the series adds to reducer.cpp and logger.cpp, in file order
    bound_methods: List[str]  # Reducer and Logger methods the init.cpp hunks bind
    replaced: List[
        ReplacedFunction
    ]  # functions of the base that the series changes, in file order
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
    return (
        patched_file.target_file[2:]
        if patched_file.target_file.startswith("b/")
        else patched_file.path
    )


@dataclasses.dataclass(frozen=True)
class _KnownLine:
    """A line of a source-only file that the series' hunks show."""

    text: str
    patch: Optional[str]  # the patch that added it; None for a line of the base file
    base_line: Optional[int] = None  # its line number in the base file, if it is one


def _whole_functions(lines: List[str]) -> List[Tuple[int, int]]:
    """The [first, last] indices of the function definitions that ``lines`` show whole."""
    spans, start = [], None
    for i, line in enumerate(lines):
        if start is None and _DEFINITION.match(line):
            start = i
        elif start is not None and _DEFINITION_END.match(line):
            spans.append((start, i))
            start = None
    return spans


def _check_replacement(
    patch_name: str,
    patched_file: unidiff.PatchedFile,
    hunk: unidiff.Hunk,
    replaceable: bool,
    base_line_no: int,
) -> str:
    """The function of the base file that ``hunk`` changes by removing its line at ``base_line_no``.

    Raises SeriesError unless that function lies whole in the hunk.

    Whole on both sides: the definition it changes, from its first line to its
    closing brace, and the definition that replaces it.
    """
    if not replaceable:
        raise SeriesError(
            f"{patch_name}: a hunk at {patched_file.path}:{hunk.source_start} removes line "
            f"{base_line_no}, a line of the base file. On this base the overlay carries only additions "
            f"to {', '.join(SOURCE_ONLY)}, because the wheel does not ship them; keep C++ changes "
            "additive (new member functions only)."
        )
    source_lines = [line for line in hunk if not line.is_added]
    source = [line.value for line in source_lines]
    removed = [
        i for i, line in enumerate(source_lines) if line.source_line_no == base_line_no
    ]
    target = [line.value for line in hunk if not line.is_removed]
    spans = _whole_functions(source)
    changed = {_DEFINITION.match(source[first]).group("name") for first, _ in spans}  # type: ignore[union-attr]
    replacing = {_DEFINITION.match(target[first]).group("name") for first, _ in _whole_functions(target)}  # type: ignore[union-attr]
    enclosing = [
        first for first, last in spans if any(first <= i <= last for i in removed)
    ]
    if not enclosing or not changed <= replacing:
        raise SeriesError(
            f"{patch_name}: a hunk at {patched_file.path}:{hunk.source_start} changes a function of "
            "the base file without showing all of it, before and after. The overlay replaces a "
            "changed function whole, from the hunk: make the series' .cpp diffs with "
            "git format-patch --function-context (tools/format_series.py does)."
        )
    match = _DEFINITION.match(source[enclosing[0]])
    assert match is not None  # _whole_functions starts a span there
    return match.group("name")


def _changed_binding(
    patch_name: str,
    patched_file: unidiff.PatchedFile,
    hunk: unidiff.Hunk,
    base_line_no: int,
) -> str:
    """The name of the init.cpp binding (``.def(\n "_name",``) whose line ``base_line_no`` ``hunk`` removes."""
    source = [line for line in hunk if not line.is_added]
    at = next(i for i, line in enumerate(source) if line.source_line_no == base_line_no)
    for i in range(at, 0, -1):
        match = _DEF_NAME.match(source[i].value)
        if match and _DEF_OPEN.match(source[i - 1].value):
            return match.group("name")
        if i < at and _DEF_OPEN.match(source[i].value):
            break
    raise SeriesError(
        f"{patch_name}: a hunk at {patched_file.path}:{hunk.source_start} removes line {base_line_no}, "
        "a line of the base file, outside a binding that it shows from its `.def(`. The overlay's "
        "bindings.cpp stands in for init.cpp: the series may change a binding of the base file "
        "only where it binds a function that the series replaces."
    )


def _apply_hunks(
    patch_name: str,
    patched_file: unidiff.PatchedFile,
    known: Dict[int, _KnownLine],
    replaceable: bool,
    changed: Set[str],
) -> Dict[int, _KnownLine]:
    """The lines known after ``patched_file``, by line number, from those known before it.

    The base file is not at hand, so only the lines the hunks show are known. A
    hunk may remove lines that an earlier patch of the series added. It may
    remove lines of the base file only where ``replaceable``: in a compiled
    file, only inside a function that it shows whole, and in init.cpp only
    inside a binding; the names of those functions, or bindings, go into
    ``changed``.
    """
    after: Dict[int, _KnownLine] = {}
    hunks = sorted(patched_file, key=lambda h: h.source_start)
    for line_no, known_line in known.items():
        if any(
            h.source_start <= line_no < h.source_start + h.source_length for h in hunks
        ):
            continue  # the hunk that covers it says what becomes of it
        shift = sum(
            h.target_length - h.source_length
            for h in hunks
            if h.source_start + h.source_length <= line_no
        )
        after[line_no + shift] = known_line
    for hunk in hunks:
        for line in hunk:
            if line.is_removed:
                assert line.source_line_no is not None  # removed lines have one
                removed = known.get(line.source_line_no)
                if removed is None or removed.patch is None:
                    if replaceable and _target_path(patched_file) == INIT_CPP:
                        name = _changed_binding(
                            patch_name, patched_file, hunk, line.source_line_no
                        )
                    else:
                        name = _check_replacement(
                            patch_name,
                            patched_file,
                            hunk,
                            replaceable,
                            line.source_line_no,
                        )
                    changed.add(name)
            elif line.is_added:
                assert line.target_line_no is not None  # added lines have one
                after[line.target_line_no] = _KnownLine(line.value, patch_name)
            else:
                assert (
                    line.source_line_no is not None and line.target_line_no is not None
                )
                # Every line the series added before it is known, and only those
                # moved it away from where it is in the base file.
                added_before = sum(
                    1 for n, k in known.items() if k.patch and n < line.source_line_no
                )
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
        if (
            last
            and last.patch == line.patch
            and last.first_line + last.text.count("\n") == line_no
        ):
            fragments[-1] = dataclasses.replace(last, text=last.text + line.text)
        else:
            fragments.append(
                Fragment(
                    patch=line.patch, path=path, first_line=line_no, text=line.text
                )
            )
    return fragments


def _whole_changes(
    path: str, known: Dict[int, _KnownLine], changed: Set[str]
) -> Tuple[List[ReplacedFunction], List[Fragment]]:
    """The functions of the base file that the series changed, and the ones it added, whole.

    A changed function of the base file is shown whole (see _check_replacement),
    so it lies whole in a run of consecutive known lines, as does every
    function the series adds: diff may pair a line of a new function (its
    closing brace, say) with one of the base file, so a new function is taken
    whole too, not line by line. What lies between functions (comments) is
    left out.
    """
    replaced: List[ReplacedFunction] = []
    added: List[Fragment] = []
    taken: Set[int] = set()
    numbers = sorted(known)
    runs: List[List[int]] = []
    for n in numbers:
        if runs and runs[-1][-1] + 1 == n:
            runs[-1].append(n)
        else:
            runs.append([n])
    for run in runs:
        texts = [known[n].text for n in run]
        for first, last in _whole_functions(texts):
            patches = [
                p
                for p in (known[n].patch for n in run[first : last + 1])
                if p is not None
            ]
            if not patches:
                continue  # context that no patch changed
            match = _DEFINITION.match(texts[first])
            assert match is not None  # _whole_functions starts a span there
            text = "".join(texts[first : last + 1])
            taken.update(run[first : last + 1])
            # A function of the base file: one whose first line a patch removed,
            # or one whose first line is the base file's.
            if match.group("name") in changed or known[run[first]].patch is None:
                replaced.append(
                    ReplacedFunction(path, match.group("name"), run[first], text)
                )
            else:
                added.append(
                    Fragment(
                        patch=patches[0], path=path, first_line=run[first], text=text
                    )
                )
    constants: List[Fragment] = []
    for n, line in sorted(known.items()):
        if line.patch and n not in taken and _CONSTANT.match(line.text):
            end = n
            while (
                not known[end].text.rstrip().endswith(";")
                and known.get(end + 1, line).patch == line.patch
            ):
                end += 1
            text = "".join(known[k].text for k in range(n, end + 1))
            if text.rstrip().endswith(";"):
                taken.update(range(n, end + 1))
                constants.append(Fragment(line.patch, path, n, text, declaration=True))
    for n, line in sorted(known.items()):
        if (
            line.patch
            and n not in taken
            and line.text.strip()
            and not line.text.lstrip().startswith("//")
        ):
            raise SeriesError(
                f"{line.patch}: it adds {path}:{n} ({line.text.strip()[:60]}), which the hunks do not "
                "show inside a whole function. The overlay compiles changed and added functions "
                "whole: make the series' .cpp diffs with git format-patch --function-context "
                "(tools/format_series.py does)."
            )
    return replaced, constants + added


def _bound_methods(patched_file: unidiff.PatchedFile) -> List[str]:
    names = []
    for hunk in patched_file:
        added = [line.value.rstrip("\n") for line in hunk if line.is_added]
        for opening, name_line in zip(added, added[1:]):
            match = _DEF_NAME.match(name_line)
            if _DEF_OPEN.match(opening) and match:
                names.append(match.group("name"))
    return names


def read_series(
    patches_dir: pathlib.Path,
    site_packages: pathlib.Path,
    replaceable: bool = False,
    count: Optional[int] = None,
) -> Series:
    """Parse the series and sort its files into the overlay's roles.

    Args:
        patches_dir: directory holding the ``git format-patch`` files.
        site_packages: the wheel's site-packages, to tell which files it ships.
        replaceable: whether the series may change functions of the compiled
            files' base (see :class:`ReplacedFunction`).
        count: read only the first ``count`` patches, a series cut short.

    Raises:
        SeriesError: a file of the series fits no role, or a hunk of a file
            the wheel does not ship removes a line of the base file, other than
            in a function it shows whole where ``replaceable``.
    """
    patches = patch_files(patches_dir)[:count]
    applied: List[str] = []
    known: Dict[str, Dict[int, _KnownLine]] = {path: {} for path in SOURCE_ONLY}
    changed: Dict[str, Set[str]] = {path: set() for path in SOURCE_ONLY}
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
                known[path] = _apply_hunks(
                    patch.name, patched_file, known[path], replaceable, changed[path]
                )
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
    replaced: List[ReplacedFunction] = []
    fragments: List[Fragment] = []
    for path in COMPILED:
        if replaceable:
            path_replaced, path_added = _whole_changes(path, known[path], changed[path])
            replaced += path_replaced
            fragments += path_added
        else:
            fragments += _fragments(path, known[path])
    rebound = changed[INIT_CPP] - {r.binding for r in replaced}
    if rebound:
        raise SeriesError(
            f"the series changes the init.cpp bindings {', '.join(sorted(rebound))}, which bind no "
            "function that it replaces. The overlay's bindings.cpp stands in for init.cpp and "
            "cannot carry a changed binding of a function that stays libtorch's."
        )
    base_lines = {
        path: {k.base_line: k.text for k in lines.values() if k.base_line is not None}
        for path, lines in known.items()
    }
    return Series(
        patches=patches,
        applied=applied,
        fragments=fragments,
        bound_methods=bound,
        replaced=replaced,
        base_lines=base_lines,
    )
