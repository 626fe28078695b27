"""Three linters of plain text, one a --check:

  --check newlines  NEWLINE: a file ends in exactly one newline (`lintrunner -a` fixes it)
  --check spaces    SPACES: no line has trailing whitespace
  --check tabs      TABS: no line has a tab
"""

from typing import List

from lint_message import (
    lint_and_emit,
    LintMessage,
    LintSeverity,
    make_argument_parser,
    REPO,
)

CHECKS = ("newlines", "spaces", "tabs")


def check_text(kind: str, paths: List[str]) -> List[LintMessage]:
    messages = []
    code = kind.upper()
    for path in paths:
        text = (REPO / path).read_text()
        if kind == "newlines":
            if text and not text.endswith("\n") or text.endswith("\n\n"):
                messages.append(
                    LintMessage(
                        path=path,
                        line=None,
                        char=None,
                        code=code,
                        severity=LintSeverity.ERROR,
                        name="newline",
                        original=text,
                        replacement=text.rstrip("\n") + "\n",
                        description="File must end in exactly one newline.",
                    )
                )
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if kind == "spaces" and line != line.rstrip():
                messages.append(
                    LintMessage(
                        path=path,
                        line=number,
                        char=len(line.rstrip()) + 1,
                        code=code,
                        severity=LintSeverity.ERROR,
                        name="trailing-space",
                        original=None,
                        replacement=None,
                        description="Trailing whitespace.",
                    )
                )
            if kind == "tabs" and "\t" in line:
                messages.append(
                    LintMessage(
                        path=path,
                        line=number,
                        char=line.index("\t") + 1,
                        code=code,
                        severity=LintSeverity.ERROR,
                        name="tab",
                        original=None,
                        replacement=None,
                        description="Tab; indent with spaces.",
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
