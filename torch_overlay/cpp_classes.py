"""Find the classes that C++ headers declare, their bases, and the data members a series adds.

A data member that the series adds to a class that libtorch was compiled with
would change the class's layout under libtorch's code, so it may not reach an
installed header. The overlay leaves it out of the header it installs and
carries it in a shim keyed by the object's address (see codegen.py); this
module finds such members, from the stock and the patched header.

The scanner reads what c10d's headers hold: namespaces, classes and structs,
their member declarations and inline functions. It drops comments, string and
character literals and preprocessor lines, then splits the text at braces and
semicolons. It is not a C++ parser: a declaration it cannot classify is one
that the overlay refuses rather than guesses.
"""

import dataclasses
import difflib
import re
from typing import List, Optional, Set, Tuple

# The words that start a member declaration that holds no data of the object.
_NOT_DATA = re.compile(
    r"^(using|typedef|friend|static|static_assert|template|enum|class|struct|union|"
    r"constexpr\s+static|inline\s+static)\b"
)
_ACCESS = re.compile(r"^\s*(public|protected|private)\s*:")
_CLASS_HEAD = re.compile(
    r"\b(?P<kind>class|struct)\s+(?:(?:[A-Z][A-Z0-9_]*_API|alignas\([^)]*\))\s+)*"
    r"(?P<name>\w+)\s*(?:final\s*)?(?::\s*(?P<bases>[^{]*))?$"
)
_NAMESPACE_HEAD = re.compile(r"\bnamespace\s*(?P<name>[\w:]*)\s*$")
# The name a data member declaration declares: the identifier before its
# initializer, bit-field width or array bound.
_DECLARED_NAME = re.compile(r"(?P<name>[A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*$")


class ClassesError(Exception):
    """A header holds what the overlay cannot carry; the message says why."""


@dataclasses.dataclass(frozen=True)
class CppClass:
    """A class or struct that a header declares."""

    qualified: str  # such as "c10d::Reducer"
    bases: Tuple[str, ...]  # as written, such as ("Backend",) or ("::c10d::Backend",)
    first_line: int  # of its body, 1-based
    last_line: int


@dataclasses.dataclass(frozen=True)
class DataMember:
    """A data member declaration in a class body."""

    owner: str  # the qualified class
    # Whether the class is nested in another: an object of it may live inside
    # another's container and move there, as a Reducer's Buckets do.
    nested: bool
    name: str
    text: str  # the whole declaration, without its access label
    first_line: int  # 1-based, in the header
    last_line: int


@dataclasses.dataclass(frozen=True)
class AddedMember:
    """A data member that a patched header adds to a class of the stock header."""

    header: str  # repo path of the header
    member: DataMember


def _blank_out(text: str) -> str:
    """Return ``text`` with comments, literals and preprocessor lines as spaces, newlines kept."""
    out = []
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c == "#":
            end = i
            while end < n and (text[end] != "\n" or text[end - 1] == "\\"):
                end += 1
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
            continue
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end == -1 else end
            out.append(" " * (end - i))
            i = end
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end == -1 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
            continue
        if c in "\"'":
            end = i + 1
            while end < n and text[end] != c:
                end += 2 if text[end] == "\\" else 1
            out.append(" " * (min(end, n - 1) + 1 - i))
            i = end + 1
            continue
        out.append(c)
        at_line_start = c == "\n" or (at_line_start and c in " \t")
        i += 1
    return "".join(out)


def _find_line(text: str, position: int) -> int:
    return text.count("\n", 0, position) + 1


def scan(text: str) -> Tuple[List[CppClass], List[DataMember]]:
    """Return the classes that ``text``, a header, declares, and the data members of each."""
    code = _blank_out(text)
    classes: List[CppClass] = []
    members: List[DataMember] = []
    # Each open brace: ("namespace", qualified), ("class", qualified, body start,
    # bases) or ("other",).
    stack: List[tuple] = []
    statement_start = 0

    def qualify(name: str) -> str:
        outer = next((s[1] for s in reversed(stack) if s[0] != "other"), "")
        return "::".join(filter(None, [outer, name]))

    def is_in_class_body() -> bool:
        return bool(stack) and stack[-1][0] == "class"

    i = 0
    while i < len(code):
        c = code[i]
        if c == "{":
            head = code[statement_start:i].strip()
            namespace = _NAMESPACE_HEAD.search(head)
            klass = _CLASS_HEAD.search(head)
            if namespace and not head.startswith("using"):
                stack.append(("namespace", qualify(namespace["name"])))
                statement_start = i + 1
            elif klass and "(" not in head:
                qualified = qualify(klass["name"])
                bases = tuple(
                    re.sub(
                        r"^(public|protected|private|virtual)\s+", "", b.strip()
                    ).strip()
                    for b in (klass["bases"] or "").split(",")
                    if b.strip()
                )
                stack.append(("class", qualified, i, bases))
                statement_start = i + 1
            elif is_in_class_body() and (
                "(" not in head.split("=")[0] or head.count("(") > head.count(")")
            ):
                # A brace initializer, of a data member or of a default argument:
                # the declaration goes on.
                depth, j = 1, i + 1
                while depth and j < len(code):
                    depth += {"{": 1, "}": -1}.get(code[j], 0)
                    j += 1
                i = j
                continue
            else:
                stack.append(("other",))
                statement_start = i + 1
        elif c == "}":
            if not stack:
                raise ClassesError(f"an unbalanced }} at line {_find_line(text, i)}")
            closed = stack.pop()
            if closed[0] == "class":
                classes.append(
                    CppClass(
                        qualified=closed[1],
                        bases=closed[3],
                        first_line=_find_line(text, closed[2]),
                        last_line=_find_line(text, i),
                    )
                )
            statement_start = i + 1
        elif c == ";":
            if is_in_class_body():
                nested = any(s[0] == "class" for s in stack[:-1])
                member = _parse_data_member(
                    text, code, statement_start, i, stack[-1][1], nested
                )
                if member is not None:
                    members.append(member)
            statement_start = i + 1
        elif (
            c == ":"
            and is_in_class_body()
            and _ACCESS.match(code[statement_start : i + 1])
        ):
            statement_start = i + 1
        i += 1
    return classes, members


def _parse_data_member(
    text: str, code: str, start: int, end: int, owner: str, nested: bool
) -> Optional[DataMember]:
    """Return the data member that the declaration ``code[start:end]`` declares, or None."""
    declaration = " ".join(code[start:end].split())
    if not declaration or _NOT_DATA.match(declaration):
        return None
    without_initializer = re.split(r"\{|=", declaration, maxsplit=1)[0]
    if "(" in without_initializer or "operator" in without_initializer:
        return (
            None  # a member function, or a function pointer (which is data: see below)
        )
    declared = _DECLARED_NAME.search(without_initializer.strip())
    if declared is None:
        raise ClassesError(
            f"cannot tell what the declaration at line {_find_line(text, start)} of "
            f"{owner} declares: {declaration[:80]!r}"
        )
    first = start + len(code[start:end]) - len(code[start:end].lstrip())
    return DataMember(
        owner=owner,
        nested=nested,
        name=declared["name"],
        text=text[first : end + 1].strip(),
        first_line=_find_line(text, first),
        last_line=_find_line(text, end),
    )


def _find_added_lines(stock: str, patched: str) -> Set[int]:
    """Return the 1-based numbers of the lines of ``patched`` that are not ``stock``'s."""
    matcher = difflib.SequenceMatcher(
        None, stock.splitlines(), patched.splitlines(), autojunk=False
    )
    added: Set[int] = set()
    for tag, _, _, j1, j2 in matcher.get_opcodes():
        if tag in ("insert", "replace"):
            added.update(range(j1 + 1, j2 + 1))
    return added


def _make_layout_key(member: DataMember) -> Tuple[str, str, str]:
    """Return what decides a member's place in its class's layout.

    Its class, name and declaration, less a ``const`` on its type, which a
    series may drop (v2.1.2's reset makes process_group_ assignable) without
    moving anything.
    """
    declaration = re.sub(r"^const\s+", "", " ".join(member.text.split()))
    return member.owner, member.name, declaration


def find_added_members(header: str, stock: str, patched: str) -> List[AddedMember]:
    """Return the data members that ``patched`` adds to the classes of ``stock``.

    Members of a class that only ``patched`` declares are not: nothing was
    compiled with its layout.

    Raises ClassesError where the patched header changes or removes a data
    member of the stock one, adds one to a class in part of a line, or uses one
    it adds outside its declaration (an inline function, which a shim cannot
    reach in code that includes the installed header).
    """
    stock_classes, stock_members = scan(stock)
    _, patched_members = scan(patched)
    # A class that the series adds has no layout that libtorch was compiled with.
    compiled = {c.qualified for c in stock_classes}
    patched_members = [m for m in patched_members if m.owner in compiled]
    added_lines = _find_added_lines(stock, patched)
    before = {_make_layout_key(m) for m in stock_members}
    after = {_make_layout_key(m) for m in patched_members}
    for owner, name, declaration in sorted(before - after):
        raise ClassesError(
            f"{header}: the series changes or removes the data member {owner}::{name} "
            f"({declaration!r}), which would change the layout of a class libtorch was "
            "compiled with"
        )
    added: List[AddedMember] = []
    for member in patched_members:
        lines = set(range(member.first_line, member.last_line + 1))
        if _make_layout_key(member) in before:
            continue
        if member.nested:
            raise ClassesError(
                f"{header}: the series adds the data member {member.name} to "
                f"{member.owner}, a class nested in another. The overlay carries an "
                "added member in a shim keyed by the object's address, and an object "
                "of a nested class may move inside its owner (a Reducer's Buckets do, "
                "in a vector): add the member to the outer class"
            )
        if not lines <= added_lines:
            raise ClassesError(
                f"{header}: the data member {member.owner}::{member.name} shares a line "
                "with the stock header; give it lines of its own"
            )
        added.append(AddedMember(header, member))
    code = _blank_out(patched)
    for item in added:
        uses = [
            _find_line(patched, m.start())
            for m in re.finditer(rf"\b{re.escape(item.member.name)}\b", code)
            if not item.member.first_line
            <= _find_line(patched, m.start())
            <= item.member.last_line
        ]
        if uses:
            raise ClassesError(
                f"{header}: line {uses[0]} uses {item.member.owner}::{item.member.name}, "
                "a data member that the series adds, in the header. The overlay carries "
                "such a member outside the class, where only the functions it compiles "
                "reach it: define the function that uses it in the .cpp file"
            )
    return added


def strip_members(patched: str, added: List[AddedMember]) -> str:
    """Return ``patched`` without the lines that declare the ``added`` members."""
    dropped = {
        n
        for item in added
        for n in range(item.member.first_line, item.member.last_line + 1)
    }
    return "".join(
        line
        for n, line in enumerate(patched.splitlines(keepends=True), 1)
        if n not in dropped
    )
