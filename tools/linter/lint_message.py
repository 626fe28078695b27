"""What every linter of .lintrunner.toml shares with lintrunner: the paths it is given,
and the lint messages it prints, one JSON object a line on stdout, and nothing else.
"""

import argparse
import contextlib
import json
import pathlib
import sys
from enum import Enum
from typing import Callable, Iterable, NamedTuple, Optional

# The repository's root: lintrunner runs the linters there, and the paths it passes are
# relative to it.
REPO = pathlib.Path(__file__).resolve().parents[2]


class LintSeverity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    ADVICE = "advice"
    DISABLED = "disabled"


class LintMessage(NamedTuple):
    path: Optional[str]
    line: Optional[int]
    char: Optional[int]
    code: str
    severity: LintSeverity
    name: str
    original: Optional[str]
    replacement: Optional[str]
    description: Optional[str]


def make_message(
    code: str,
    name: str,
    description: str,
    *,
    severity: LintSeverity = LintSeverity.ERROR,
    path: Optional[str] = None,
    line: Optional[int] = None,
    char: Optional[int] = None,
    original: Optional[str] = None,
    replacement: Optional[str] = None,
) -> LintMessage:
    """Make a message of the linter ``code``: an error unless ``severity`` says otherwise.

    It is in ``path`` (at ``line`` and ``char``) where given, and has a fix where
    ``replacement`` is given: `lintrunner -a` writes it over ``original``, the file's text.
    """
    return LintMessage(
        path=path,
        line=line,
        char=char,
        code=code,
        severity=severity,
        name=name,
        original=original,
        replacement=replacement,
        description=description,
    )


def make_argument_parser(description: str) -> argparse.ArgumentParser:
    """Make a linter's command line: the paths that lintrunner passes it as @PATHSFILE."""
    parser = argparse.ArgumentParser(
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        fromfile_prefix_chars="@",
    )
    parser.add_argument(
        "paths",
        nargs="*",
        help="the files to lint, or @PATHSFILE, a file that names them one a line",
    )
    return parser


def emit(messages: Iterable[LintMessage]) -> None:
    for message in messages:
        print(json.dumps(message._asdict()), flush=True)


def lint_and_emit(lint: Callable[[], Iterable[LintMessage]]) -> None:
    """Run ``lint`` and print its messages, with what it prints on the way sent to stderr.

    lintrunner reads stdout as lint messages, so nothing else may go there: the patch series
    linter's overlay prints its progress when it first checks a wheel, before its result is
    in the build cache. (The linters' own subprocesses capture their output, so Python's
    stdout is the one to redirect.)
    """
    with contextlib.redirect_stdout(sys.stderr):
        messages = list(lint())
    emit(messages)
