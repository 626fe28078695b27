"""MYPY: mypy with mypy.ini."""

import re
import sys
from typing import List

from checkers import parse_errors, run_tool
from lint_message import (
    lint_and_emit,
    LintMessage,
    make_argument_parser,
    make_message,
    REPO,
)

# mypy's errors and notes (parse_errors leaves the notes out).
MYPY_MESSAGE = re.compile(
    r"^(?P<path>.*?):(?P<line>\d+): (?P<severity>error|note): (?P<message>.*?)(?:  \[(?P<name>.*)\])?$"
)


def run_mypy(paths: List[str]) -> List[LintMessage]:
    # mypy 1.4 warns about its own use of mypy_extensions on stderr.
    python = [sys.executable, "-W", "ignore::DeprecationWarning"]
    result = run_tool(
        "MYPY", [*python, "-m", "mypy", "--config-file", str(REPO / "mypy.ini"), *paths]
    )
    messages = parse_errors("MYPY", MYPY_MESSAGE, result.stdout)
    if result.returncode not in (0, 1):
        messages.append(make_message("MYPY", "command-failed", result.stderr.strip()))
    return messages


def main() -> None:
    args = make_argument_parser(__doc__).parse_args()
    lint_and_emit(lambda: run_mypy(args.paths))


if __name__ == "__main__":
    main()
