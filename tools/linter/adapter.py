"""lintrunner adapters: run a linter and print its findings as lintrunner's JSON lint messages.

One entry point serves every linter in .lintrunner.toml:

  adapter.py init REQUIREMENTS_FILE     install the linters (lintrunner init)
  adapter.py flake8 @PATHSFILE          flake8 with .flake8 (PyTorch's settings)
  adapter.py clang-format @PATHSFILE    clang-format with .clang-format (PyTorch's style)
  adapter.py mypy @PATHSFILE            mypy with mypy.ini
  adapter.py ufmt @PATHSFILE            black + usort, as PyTorch 2.1's UFMT linter runs them
  adapter.py newlines|spaces|tabs @PATHSFILE

The patch series linter is tools/linter/patch_series.py.
"""

import argparse
import re
import subprocess
import sys
from typing import List

from checkers import clang_format_messages, flake8, run_tool, ufmt_format
from lint_message import lint_and_emit, LintMessage, LintSeverity, REPO


def clang_format(paths: List[str]) -> List[LintMessage]:
    messages = []
    for path in paths:
        text = (REPO / path).read_text()
        messages += clang_format_messages(
            path, text, "Run `lintrunner -a` to apply PyTorch's clang-format style."
        )
    return messages


def mypy(paths: List[str]) -> List[LintMessage]:
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


UFMT_DESCRIPTION = "Run `lintrunner -a` to apply PyTorch's black and usort formatting."
# The test files that the patch series builds (this repository keeps a copy per base).
SERIES_BUILT = "test/distributed/"
SERIES_BUILT_DESCRIPTION = (
    UFMT_DESCRIPTION
    + " The patch series builds this file: change the patch that adds these lines the same way."
)


def ufmt(paths: List[str]) -> List[LintMessage]:
    messages = []
    for path in paths:
        text = (REPO / path).read_text()
        try:
            formatted = ufmt_format(path, text)
        except Exception as e:
            # Black and usort raise their own errors for code they cannot parse.
            messages.append(
                LintMessage(
                    path=path,
                    line=None,
                    char=None,
                    code="UFMT",
                    severity=LintSeverity.ERROR,
                    name="command-failed",
                    original=None,
                    replacement=None,
                    description=f"{type(e).__name__}: {e}",
                )
            )
            continue
        if formatted != text:
            messages.append(
                LintMessage(
                    path=path,
                    line=None,
                    char=None,
                    code="UFMT",
                    severity=LintSeverity.WARNING,
                    name="format",
                    original=text,
                    replacement=formatted,
                    description=(
                        SERIES_BUILT_DESCRIPTION
                        if path.startswith(SERIES_BUILT)
                        else UFMT_DESCRIPTION
                    ),
                )
            )
    return messages


def text_checks(kind: str, paths: List[str]) -> List[LintMessage]:
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


def init(requirements: List[str], dry_run: bool) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    for path in requirements:
        cmd += ["-r", str(REPO / path)]
    if dry_run:
        print("would run: " + " ".join(cmd))
        return
    subprocess.run(cmd, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        fromfile_prefix_chars="@",
    )
    linters = (
        "init",
        "flake8",
        "clang-format",
        "mypy",
        "ufmt",
        "newlines",
        "spaces",
        "tabs",
    )
    parser.add_argument("linter", choices=linters)
    parser.add_argument(
        "--dry-run", default="0", help="for init: 1 to only print the pip command"
    )
    parser.add_argument(
        "args",
        nargs="*",
        help="the files to lint, or @PATHSFILE, a file that names them one a line",
    )
    args = parser.parse_intermixed_args()
    if args.linter == "init":
        init(args.args, args.dry_run == "1")
        return
    lint_and_emit(lambda: run_linter(args.linter, args.args))


def run_linter(linter: str, paths: List[str]) -> List[LintMessage]:
    if linter == "flake8":
        return flake8(paths)
    if linter == "clang-format":
        return clang_format(paths)
    if linter == "mypy":
        return mypy(paths)
    if linter == "ufmt":
        return ufmt(paths)
    return text_checks(linter, paths)


if __name__ == "__main__":
    main()
