"""UFMT: black + usort, as PyTorch 2.1's UFMT linter runs them.

`lintrunner -a` applies their changes.
"""

from typing import List

from checkers import format_with_ufmt
from lint_message import (
    lint_and_emit,
    LintMessage,
    LintSeverity,
    make_argument_parser,
    make_message,
    REPO,
)

UFMT_DESCRIPTION = "Run `lintrunner -a` to apply PyTorch's black and usort formatting."
# The test files that the patch series builds (this repository keeps a copy per base).
SERIES_BUILT = "test/distributed/"
SERIES_BUILT_DESCRIPTION = (
    UFMT_DESCRIPTION
    + " The patch series builds this file: change the patch that adds these lines the same way."
)


def lint_ufmt(paths: List[str]) -> List[LintMessage]:
    messages = []
    for path in paths:
        text = (REPO / path).read_text()
        try:
            formatted = format_with_ufmt(path, text)
        except Exception as e:
            # Black and usort raise their own errors for code they cannot parse.
            description = f"{type(e).__name__}: {e}"
            messages.append(
                make_message("UFMT", "command-failed", description, path=path)
            )
            continue
        if formatted != text:
            description = (
                SERIES_BUILT_DESCRIPTION
                if path.startswith(SERIES_BUILT)
                else UFMT_DESCRIPTION
            )
            messages.append(
                make_message(
                    "UFMT",
                    "format",
                    description,
                    severity=LintSeverity.WARNING,
                    path=path,
                    original=text,
                    replacement=formatted,
                )
            )
    return messages


def main() -> None:
    args = make_argument_parser(__doc__).parse_args()
    lint_and_emit(lambda: lint_ufmt(args.paths))


if __name__ == "__main__":
    main()
