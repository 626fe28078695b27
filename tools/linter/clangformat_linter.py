"""CLANGFORMAT: clang-format with .clang-format (PyTorch's style).

`lintrunner -a` applies its changes.
"""

from typing import List

from checkers import clang_format_messages
from lint_message import argument_parser, lint_and_emit, LintMessage, REPO


def clang_format(paths: List[str]) -> List[LintMessage]:
    messages = []
    for path in paths:
        text = (REPO / path).read_text()
        messages += clang_format_messages(
            path, text, "Run `lintrunner -a` to apply PyTorch's clang-format style."
        )
    return messages


def main() -> None:
    args = argument_parser(__doc__).parse_args()
    lint_and_emit(lambda: clang_format(args.paths))


if __name__ == "__main__":
    main()
