"""Follow what the series does to the C++ sources that the wheel lacks, from their hunks alone.

The wheel ships no ``.cpp`` file, so the overlay knows of one only the lines
that the series' hunks show. :func:`apply_hunks` keeps those lines, patch by
patch, with where each came from: the base file, or a patch of the series.
A hunk that changes a function of the base file must show it whole, before
and after (the series' ``.cpp`` diffs are made with ``git format-patch
--function-context``), and so must one that adds a function. From the lines
known at the end, :func:`find_whole_changes` takes each changed or added function
whole, and :func:`prologues` the statements that the series adds at the start
of a function that the overlay cannot compile.
"""

import dataclasses
import re
from typing import Dict, List, Optional, Set, Tuple

import unidiff

# A binding in init.cpp: `.def(\n "_name",`.
_DEF_NAME = re.compile(r'^\s*"(?P<name>[A-Za-z_][A-Za-z0-9_]*)",\s*$')
_DEF_OPEN = re.compile(r"^\s*\.def\(\s*$")
# A function definition's first line in c10d's C++: at column 0, such as
# "bool Reducer::reset_state() {" or "void Reducer::update_process_group(".
# A constructor or destructor has no return type: "Reducer::Reducer(" at column 0.
_DEFINITION = re.compile(
    r"^(?:[A-Za-z_][^;]*\b)?(?P<name>[A-Za-z_]\w*::~?[A-Za-z_]\w*)\("
)
# The first line of a definition whose head clang-format splits after the class,
# as for a long return type: "std::pair<...> Reducer::", then "    name(...) {".
_SPLIT_DEFINITION = re.compile(r"^[A-Za-z_][^;(]*\b(?P<owner>[A-Za-z_]\w*)::$")
_SPLIT_NAME = re.compile(r"^\s+(?P<member>~?[A-Za-z_]\w*)\(")
# The closing brace of a function definition, at column 0.
_DEFINITION_END = re.compile(r"^}\s*$")
# The first line of a constant that a series adds at namespace scope.
_CONSTANT = re.compile(r"^(static\s+)?constexpr\s")
FUNCTION_CONTEXT_HINT = (
    "make the series' .cpp diffs with git format-patch --function-context "
    "(tools/format_series.py does)"
)


class SeriesError(Exception):
    """The series cannot be carried by the overlay; the message says why."""


@dataclasses.dataclass(frozen=True)
class KnownLine:
    """A line of a source-only file that the series' hunks show."""

    text: str
    # The patch that added it; None for a line of the base file.
    patch: Optional[str]
    # Its line number in the base file, if it is one.
    base_line: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class WholeFunction:
    """A function of a source-only file, whole, as the whole series leaves it."""

    path: str
    name: str  # qualified as in the definition, such as "Reducer::reset_state"
    first_line: int  # line number in the file that the whole series patches
    text: str
    # The patch of its first line that the series changed or added.
    patch: str
    # Whether the base file has it (the series changes it), or the series adds it.
    changes_base: bool
    # The patched definition's lines, each with the patch that added it (None: the
    # base file's).
    lines: Tuple[KnownLine, ...]

    @property
    def member(self) -> str:
        """Return the function's own name, without its class."""
        return self.name.split("::")[-1]

    @property
    def binding(self) -> str:
        """Return the name torch._C._distributed_c10d binds a Reducer method as."""
        return f"_{self.member}"

    @property
    def renamed(self) -> str:
        """Return the name that the overlay compiles a changed function of libtorch under.

        libtorch keeps its own definition under the function's name, so the
        patched one needs another, which the relocations that refer to the
        old one are then pointed at (see redirect.cpp).
        """
        return f"_overlay_replaced_{self.member}"


@dataclasses.dataclass(frozen=True)
class Declaration:
    """A constant that the series adds at namespace scope, which functions may use."""

    path: str
    first_line: int
    text: str
    patch: str


@dataclasses.dataclass(frozen=True)
class Prologue:
    """Statements that the series adds at the start of a function of libtorch.

    The function lies in a file that the overlay cannot compile (its includes
    are not in the wheel), so the overlay runs the statements before libtorch's
    own definition, through the relocations that refer to it: see
    :mod:`torch_overlay.codegen`.
    """

    path: str
    name: str  # qualified as in the definition, such as "ProcessGroupGloo::reconfigure"
    head: str  # the definition up to and including the line that opens its body
    statements: str  # the lines the series adds right after that line
    first_line: int  # where they start in the file that the whole series patches


def find_target_path(patched_file: unidiff.PatchedFile) -> str:
    """Return the path that a file diff of a patch writes, relative to the tree."""
    return (
        patched_file.target_file[2:]
        if patched_file.target_file.startswith("b/")
        else patched_file.path
    )


def _starts_definition(lines: List[str], i: int) -> bool:
    if _DEFINITION.match(lines[i]):
        return True
    return bool(
        _SPLIT_DEFINITION.match(lines[i].rstrip("\n"))
        and i + 1 < len(lines)
        and _SPLIT_NAME.match(lines[i + 1])
    )


def _find_function_spans(lines: List[str]) -> List[Tuple[int, int]]:
    """Return the [first, last] indices of the function definitions that ``lines`` show whole."""
    spans, start = [], None
    for i, line in enumerate(lines):
        if start is None and _starts_definition(lines, i):
            start = i
        elif start is not None and _DEFINITION_END.match(line):
            spans.append((start, i))
            start = None
    return spans


def _read_definition_name(lines: List[str], i: int) -> str:
    """Return the qualified name of the definition that starts at ``lines[i]``."""
    match = _DEFINITION.match(lines[i])
    if match:
        return match.group("name")
    owner = _SPLIT_DEFINITION.match(lines[i].rstrip("\n"))
    member = _SPLIT_NAME.match(lines[i + 1])
    assert owner is not None and member is not None  # _starts_definition said so
    return f"{owner['owner']}::{member['member']}"


def _check_changed_function(
    patch_name: str,
    patched_file: unidiff.PatchedFile,
    hunk: unidiff.Hunk,
    base_line_no: int,
) -> str:
    """Return the function of the base file that ``hunk`` changes by removing its line ``base_line_no``.

    Raises SeriesError unless that function lies whole in the hunk, before and
    after: from its first line to its closing brace, and the definition that
    replaces it.
    """
    source_lines = [line for line in hunk if not line.is_added]
    source = [line.value for line in source_lines]
    removed = [
        i for i, line in enumerate(source_lines) if line.source_line_no == base_line_no
    ]
    target = [line.value for line in hunk if not line.is_removed]
    spans = _find_function_spans(source)
    changed = {_read_definition_name(source, first) for first, _ in spans}
    replacing = {
        _read_definition_name(target, first)
        for first, _ in _find_function_spans(target)
    }
    enclosing = [
        first for first, last in spans if any(first <= i <= last for i in removed)
    ]
    if not enclosing or not changed <= replacing:
        raise SeriesError(
            f"{patch_name}: a hunk at {patched_file.path}:{hunk.source_start} changes a "
            "function of the base file without showing all of it, before and after. The "
            "overlay takes a changed function whole, from the hunk: "
            + FUNCTION_CONTEXT_HINT
            + "."
        )
    return _read_definition_name(source, enclosing[0])


def _check_changed_binding(
    patch_name: str,
    patched_file: unidiff.PatchedFile,
    hunk: unidiff.Hunk,
    base_line_no: int,
) -> str:
    """Return the init.cpp binding (``.def(\n "_name",``) whose line ``base_line_no`` ``hunk`` removes."""
    source = [line for line in hunk if not line.is_added]
    at = next(i for i, line in enumerate(source) if line.source_line_no == base_line_no)
    for i in range(at, 0, -1):
        match = _DEF_NAME.match(source[i].value)
        if match and _DEF_OPEN.match(source[i - 1].value):
            return match.group("name")
        if i < at and _DEF_OPEN.match(source[i].value):
            break
    raise SeriesError(
        f"{patch_name}: a hunk at {patched_file.path}:{hunk.source_start} removes line "
        f"{base_line_no}, a line of the base file, outside a binding that it shows from "
        "its `.def(`. The overlay binds anew what the series binds: it may change a "
        "binding of the base file only where it binds a function that it changes."
    )


def apply_hunks(
    patch_name: str,
    patched_file: unidiff.PatchedFile,
    known: Dict[int, KnownLine],
    changed: Set[str],
    is_bindings: bool,
) -> Dict[int, KnownLine]:
    """Return the lines known after ``patched_file``, by line number, from those known before it.

    The base file is not at hand, so only the lines the hunks show are known. A
    hunk may remove lines that an earlier patch of the series added. It may
    remove lines of the base file only inside a function that it shows whole,
    or, in init.cpp (``is_bindings``), inside a binding; the names of those
    functions, or bindings, go into ``changed``.
    """
    after: Dict[int, KnownLine] = {}
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
                    check = (
                        _check_changed_binding
                        if is_bindings
                        else _check_changed_function
                    )
                    changed.add(
                        check(patch_name, patched_file, hunk, line.source_line_no)
                    )
            elif line.is_added:
                assert line.target_line_no is not None  # added lines have one
                after[line.target_line_no] = KnownLine(line.value, patch_name)
            else:
                assert (
                    line.source_line_no is not None and line.target_line_no is not None
                )
                # Every line the series added before it is known, and only those
                # moved it away from where it is in the base file.
                added_before = sum(
                    1 for n, k in known.items() if k.patch and n < line.source_line_no
                )
                base = KnownLine(line.value, None, line.source_line_no - added_before)
                before = known.get(line.source_line_no, base)
                if before.text != line.value:
                    raise SeriesError(
                        f"{patch_name}: a hunk at {patched_file.path}:{hunk.source_start} "
                        "does not fit the lines that the patches before it leave there"
                    )
                after[line.target_line_no] = before
    return after


def _group_runs(known: Dict[int, KnownLine]) -> List[List[int]]:
    """Return the line numbers of ``known`` as runs of consecutive ones."""
    runs: List[List[int]] = []
    for n in sorted(known):
        if runs and runs[-1][-1] + 1 == n:
            runs[-1].append(n)
        else:
            runs.append([n])
    return runs


def find_whole_changes(
    path: str, known: Dict[int, KnownLine], changed: Set[str]
) -> Tuple[List[WholeFunction], List[Declaration]]:
    """Return the functions that the series changes or adds, whole, and the constants it adds.

    A changed function of the base file is shown whole (see
    _check_changed_function), so it lies whole in a run of consecutive known
    lines, as does every function the series adds: diff may pair a line of a
    new function (its closing brace, say) with one of the base file, so a new
    function is taken whole too, not line by line. What lies between functions
    (comments) is left out.

    Raises SeriesError for an added line that lies in no whole function and is
    no constant.
    """
    functions: List[WholeFunction] = []
    taken: Set[int] = set()
    for run in _group_runs(known):
        texts = [known[n].text for n in run]
        for first, last in _find_function_spans(texts):
            lines = tuple(known[n] for n in run[first : last + 1])
            patches = [line.patch for line in lines if line.patch is not None]
            if not patches:
                continue  # context that no patch changed
            name = _read_definition_name(texts, first)
            taken.update(run[first : last + 1])
            functions.append(
                WholeFunction(
                    path=path,
                    name=name,
                    first_line=run[first],
                    text="".join(texts[first : last + 1]),
                    patch=patches[0],
                    # One whose first line a patch removed, or whose first line
                    # is the base file's.
                    changes_base=name in changed or lines[0].patch is None,
                    lines=lines,
                )
            )
    declarations: List[Declaration] = []
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
                declarations.append(Declaration(path, n, text, line.patch))
    for n, line in sorted(known.items()):
        if (
            line.patch
            and n not in taken
            and line.text.strip()
            and not line.text.lstrip().startswith("//")
        ):
            raise SeriesError(
                f"{line.patch}: it adds {path}:{n} ({line.text.strip()[:60]}), which the "
                "hunks do not show inside a whole function. The overlay takes changed and "
                "added functions whole: " + FUNCTION_CONTEXT_HINT + "."
            )
    return functions, declarations


def make_prologue(function: WholeFunction, changed: Set[str]) -> Prologue:
    """Return the statements that ``function`` of a file the overlay cannot compile gains at its start.

    Raises SeriesError unless the series only inserts lines right after the
    line that opens the body of a function of the base file.
    """
    lines = function.lines
    opening = next(
        (i for i, line in enumerate(lines) if line.text.rstrip().endswith("{")), None
    )
    added = [i for i, line in enumerate(lines) if line.patch is not None]
    contiguous = bool(added) and added == list(range(added[0], added[-1] + 1))
    if (
        not function.changes_base
        or function.name in changed
        or opening is None
        or not contiguous
        or added[0] != opening + 1
    ):
        raise SeriesError(
            f"{function.patch}: it changes {function.name} in {function.path}, which the "
            "overlay cannot compile: the wheel lacks what that file includes. There the "
            "overlay carries only statements that the series adds at the start of a "
            "function of the base file, and runs them before libtorch's definition."
        )
    return Prologue(
        path=function.path,
        name=function.name,
        head="".join(line.text for line in lines[: opening + 1]),
        statements="".join(lines[i].text for i in added),
        first_line=function.first_line + added[0],
    )


@dataclasses.dataclass(frozen=True)
class Binding:
    """A method that the series binds in init.cpp, new or changed, as its `.def(` holds it."""

    owner: str  # the c10d class whose Python class gets the method, such as "Reducer"
    name: str  # such as "_update_process_group"
    callable: str  # the function or lambda that `.def(` binds
    extras: Tuple[str, ...]  # its other arguments: py::arg(...), py::call_guard<...>()
    first_line: int
    patch: str


def _split_arguments(text: str) -> List[str]:
    """Return the top-level, comma-separated arguments of ``text``.

    A comma inside brackets, a string or character literal, or a template's
    arguments at the top level (``py::call_guard<A, B>()``) does not split.
    """
    arguments, depth, angles, quote, escaped, current = [], 0, 0, "", False, ""
    for c in text:
        if quote:
            quote = "" if c == quote and not escaped else quote
            escaped = c == "\\" and not escaped
        elif c in "\"'":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and c == "<":
            angles += 1
        elif depth == 0 and c == ">" and angles:
            angles -= 1
        if c == "," and depth == 0 and angles == 0 and not quote:
            arguments.append(current.strip())
            current = ""
        else:
            current += c
    if current.strip():
        arguments.append(current.strip())
    return arguments


def find_bindings(known: Dict[int, KnownLine], changed: Set[str]) -> List[Binding]:
    """Return the `.def(` blocks of init.cpp that the series adds, or changes (``changed``).

    Each must lie whole among the lines the hunks show; the class it binds
    onto is the c10d class that its callable first names (its first
    parameter, or the class of its member function pointer).
    """
    found = []
    for run in _group_runs(known):
        texts = [known[n].text for n in run]
        for i, text in enumerate(texts):
            if not _DEF_OPEN.match(text) or i + 1 >= len(texts):
                continue
            name = _DEF_NAME.match(texts[i + 1])
            if name is None:
                continue
            depth, end = 0, None
            for j in range(i, len(texts)):
                depth += texts[j].count("(") - texts[j].count(")")
                if depth <= 0:
                    end = j
                    break
            lines = [
                known[n]
                for n in run[i : (end if end is not None else len(run) - 1) + 1]
            ]
            patches = [line.patch for line in lines if line.patch is not None]
            if not patches and name["name"] not in changed:
                continue
            if end is None:
                raise SeriesError(
                    f"{patches[0] if patches else 'a patch'}: the init.cpp binding "
                    f"{name['name']} is not shown whole, to its closing parenthesis; "
                    "the overlay binds what the hunk holds"
                )
            block = "".join(line.text for line in lines)
            inner = block[block.index(".def(") + len(".def(") : block.rindex(")")]
            _, callable_text, *extras = _split_arguments(inner)
            owner = re.search(r"::c10d::(\w+)", callable_text)
            if owner is None:
                raise SeriesError(
                    f"the init.cpp binding {name['name']} names no c10d class in "
                    f"{callable_text[:60]!r}, to bind its method onto"
                )
            found.append(
                Binding(
                    owner=owner.group(1),
                    name=name["name"],
                    callable=callable_text,
                    extras=tuple(extras),
                    first_line=run[i],
                    patch=patches[0] if patches else "",
                )
            )
    return found
