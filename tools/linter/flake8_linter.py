"""FLAKE8: flake8 with .flake8 (PyTorch's settings and plugin pins)."""

from checkers import run_flake8
from lint_message import lint_and_emit, make_argument_parser


def main() -> None:
    args = make_argument_parser(__doc__).parse_args()
    lint_and_emit(lambda: run_flake8(args.paths))


if __name__ == "__main__":
    main()
