"""FLAKE8: flake8 with .flake8 (PyTorch's settings and plugin pins)."""

from checkers import flake8
from lint_message import argument_parser, lint_and_emit


def main() -> None:
    args = argument_parser(__doc__).parse_args()
    lint_and_emit(lambda: flake8(args.paths))


if __name__ == "__main__":
    main()
