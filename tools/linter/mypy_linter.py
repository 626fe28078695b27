"""MYPY: mypy with mypy.ini."""

import re
import sys
from typing import List

from checkers import run_tool
from lint_message import (
    lint_and_emit,
    LintMessage,
    LintSeverity,
    make_argument_parser,
    REPO,
)


def run_mypy(paths: List[str]) -> List[LintMessage]:
    # mypy 1.4 warns about its own use of mypy_extensions on stderr.
    python = [sys.executable, "-W", "ignore::DeprecationWarning"]
    result = run_tool(
        "MYPY", [*python, "-m", "mypy", "--config-file", str(REPO / "mypy.ini"), *paths]
    )
    pattern = re.compile(
        r"^(?P<path>.*?):(?P<line>\d+): (?P<severity>error|note): (?P<message>.*?)(?:  \[(?P<name>.*)\])?$"
    )
    messages = []
    for line in result.stdout.splitlines():
        match = pattern.match(line)
        if match and match["severity"] == "error":
            messages.append(
                LintMessage(
                    path=match["path"],
                    line=int(match["line"]),
                    char=None,
                    code="MYPY",
                    severity=LintSeverity.ERROR,
                    name=match["name"] or "error",
                    original=None,
                    replacement=None,
                    description=match["message"],
                )
            )
    if result.returncode not in (0, 1):
        messages.append(
            LintMessage(
                path=None,
                line=None,
                char=None,
                code="MYPY",
                severity=LintSeverity.ERROR,
                name="command-failed",
                original=None,
                replacement=None,
                description=result.stderr.strip(),
            )
        )
    return messages


def main() -> None:
    args = make_argument_parser(__doc__).parse_args()
    lint_and_emit(lambda: run_mypy(args.paths))


if __name__ == "__main__":
    main()
