"""Three linters of plain text, one a --check:

  --check newlines  NEWLINE: a file ends in exactly one newline (`lintrunner -a` fixes it)
  --check spaces    SPACES: no line has trailing whitespace
  --check tabs      TABS: no line has a tab
"""

from typing import Callable, Dict, List, Optional, Tuple

from lint_message import (
    lint_and_emit,
    LintMessage,
    make_argument_parser,
    make_message,
    REPO,
)

CHECKS = ("newlines", "spaces", "tabs")
# The checks of each line: the name of their error, its description, and where in a line
# they find it (a column from 1), or None.
LINE_CHECKS: Dict[str, Tuple[str, str, Callable[[str], Optional[int]]]] = {
    "spaces": (
        "trailing-space",
        "Trailing whitespace.",
        lambda line: len(line.rstrip()) + 1 if line != line.rstrip() else None,
    ),
    "tabs": (
        "tab",
        "Tab; indent with spaces.",
        lambda line: line.index("\t") + 1 if "\t" in line else None,
    ),
}


def check_text(kind: str, paths: List[str]) -> List[LintMessage]:
    messages = []
    code = kind.upper()
    for path in paths:
        text = (REPO / path).read_text()
        if kind == "newlines":
            if text and not text.endswith("\n") or text.endswith("\n\n"):
                messages.append(
                    make_message(
                        code,
                        "newline",
                        "File must end in exactly one newline.",
                        path=path,
                        original=text,
                        replacement=text.rstrip("\n") + "\n",
                    )
                )
            continue
        name, description, find = LINE_CHECKS[kind]
        for number, line in enumerate(text.splitlines(), 1):
            char = find(line)
            if char is not None:
                messages.append(
                    make_message(
                        code, name, description, path=path, line=number, char=char
                    )
                )
    return messages


def main() -> None:
    parser = make_argument_parser(__doc__)
    parser.add_argument("--check", choices=CHECKS, required=True)
    args = parser.parse_args()
    lint_and_emit(lambda: check_text(args.check, args.paths))


if __name__ == "__main__":
    main()
