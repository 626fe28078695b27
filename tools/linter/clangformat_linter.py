"""CLANGFORMAT: clang-format with .clang-format (PyTorch's style).

`lintrunner -a` applies its changes.
"""

from typing import List

from checkers import check_clang_format
from lint_message import lint_and_emit, LintMessage, make_argument_parser, REPO


def lint_clang_format(paths: List[str]) -> List[LintMessage]:
    messages = []
    for path in paths:
        text = (REPO / path).read_text()
        messages += check_clang_format(
            path, text, "Run `lintrunner -a` to apply PyTorch's clang-format style."
        )
    return messages


def main() -> None:
    args = make_argument_parser(__doc__).parse_args()
    lint_and_emit(lambda: lint_clang_format(args.paths))


if __name__ == "__main__":
    main()
