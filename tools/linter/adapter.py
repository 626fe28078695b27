"""lintrunner adapters: run a linter and print its findings as lintrunner's JSON lint messages.

One entry point serves every linter in .lintrunner.toml:

  adapter.py init REQUIREMENTS_FILE     install the linters (lintrunner init)
  adapter.py flake8 @PATHSFILE          flake8 with .flake8 (PyTorch's settings)
  adapter.py clang-format @PATHSFILE    clang-format with .clang-format (PyTorch's style)
  adapter.py mypy @PATHSFILE            mypy with mypy.ini
  adapter.py ufmt @PATHSFILE            black + usort, as PyTorch 2.1's UFMT linter runs them
  adapter.py newlines|spaces|tabs @PATHSFILE
  adapter.py patches @PATHSFILE         the patch series linter (tools/linter/patch_series.py)
"""

import argparse
import contextlib
import dataclasses
import json
import pathlib
import re
import subprocess
import sys
from typing import Iterable, List, Optional

REPO = pathlib.Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class LintMessage:
    path: Optional[str]
    line: Optional[int]
    char: Optional[int]
    code: str
    severity: str
    name: str
    description: Optional[str] = None
    original: Optional[str] = None
    replacement: Optional[str] = None


def emit(messages: Iterable[LintMessage]) -> None:
    for message in messages:
        print(json.dumps(dataclasses.asdict(message)), flush=True)


def read_paths(args: List[str]) -> List[str]:
    paths: List[str] = []
    for arg in args:
        if arg.startswith("@"):
            paths.extend(p for p in pathlib.Path(arg[1:]).read_text().splitlines() if p)
        else:
            paths.append(arg)
    return paths


def run_tool(code: str, cmd: List[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    except OSError as e:
        emit(
            [
                LintMessage(
                    None,
                    None,
                    None,
                    code,
                    "error",
                    "command-failed",
                    f"{cmd[0]}: {e}; run lintrunner init",
                )
            ]
        )
        sys.exit(0)


def flake8(paths: List[str]) -> List[LintMessage]:
    result = run_tool(
        "FLAKE8",
        [sys.executable, "-m", "flake8", "--config", str(REPO / ".flake8"), *paths],
    )
    pattern = re.compile(
        r"^(?P<path>.*?):(?P<line>\d+):(?P<col>\d+): (?P<name>\S+) (?P<message>.*)$"
    )
    messages = []
    for line in result.stdout.splitlines():
        match = pattern.match(line)
        if match:
            messages.append(
                LintMessage(
                    match["path"],
                    int(match["line"]),
                    int(match["col"]),
                    "FLAKE8",
                    "error",
                    match["name"],
                    match["message"],
                )
            )
    if result.returncode not in (0, 1) or (result.returncode == 1 and not messages):
        messages.append(
            LintMessage(
                None,
                None,
                None,
                "FLAKE8",
                "error",
                "command-failed",
                result.stderr.strip(),
            )
        )
    return messages


def clang_format_messages(path: str, text: str, description: str) -> List[LintMessage]:
    result = subprocess.run(
        [
            "clang-format",
            f"--style=file:{REPO / '.clang-format'}",
            f"--assume-filename={path}",
        ],
        input=text,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        return [
            LintMessage(
                path,
                None,
                None,
                "CLANGFORMAT",
                "error",
                "command-failed",
                result.stderr.strip(),
            )
        ]
    if result.stdout == text:
        return []
    return [
        LintMessage(
            path,
            None,
            None,
            "CLANGFORMAT",
            "warning",
            "format",
            description,
            text,
            result.stdout,
        )
    ]


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
            name = match["name"] or "error"
            messages.append(
                LintMessage(
                    match["path"],
                    int(match["line"]),
                    None,
                    "MYPY",
                    "error",
                    name,
                    match["message"],
                )
            )
    if result.returncode not in (0, 1):
        messages.append(
            LintMessage(
                None,
                None,
                None,
                "MYPY",
                "error",
                "command-failed",
                result.stderr.strip(),
            )
        )
    return messages


# PyTorch 2.1's UFMT linter (black + usort through ufmt, pinned in requirements-lint.txt as its
# .lintrunner.toml pins them) with its settings: pyproject.toml's [tool.black] sets only these
# target versions (black's default line length, 88), and there is no [tool.usort].
BLACK_TARGET_VERSIONS = ("PY38", "PY39", "PY310", "PY311")
UFMT_DESCRIPTION = "Run `lintrunner -a` to apply PyTorch's black and usort formatting."
# The test files that the patch series builds (this repository keeps a copy per base).
SERIES_BUILT = "test/distributed/"
SERIES_BUILT_DESCRIPTION = (
    UFMT_DESCRIPTION
    + " The patch series builds this file: change the patch that adds these lines the same way."
)


def ufmt_format(path: str, text: str) -> str:
    """``text`` as PyTorch's UFMT linter would format the file ``path`` of the PyTorch tree.

    Raises what black and usort raise for a file they cannot parse.
    """
    import black
    from ufmt.core import ufmt_bytes
    from usort import Config
    from usort.config import CAT_FIRST_PARTY

    mode = black.Mode(
        target_versions={black.TargetVersion[v] for v in BLACK_TARGET_VERSIONS}
    )
    usort_config = Config()
    # usort's first-party detection, as it works in a PyTorch tree: a file in the torch
    # package (torch/__init__.py at the root) has torch as its first party.
    if path.startswith("torch/"):
        usort_config.known["torch"] = CAT_FIRST_PARTY
    # ufmt_bytes runs usort, then black (in stub mode for a .pyi), as upstream's adapter does.
    return ufmt_bytes(
        pathlib.Path(path), text.encode(), black_config=mode, usort_config=usort_config
    ).decode()


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
                    path,
                    None,
                    None,
                    "UFMT",
                    "error",
                    "command-failed",
                    f"{type(e).__name__}: {e}",
                )
            )
            continue
        if formatted != text:
            messages.append(
                LintMessage(
                    path,
                    None,
                    None,
                    "UFMT",
                    "warning",
                    "format",
                    (
                        SERIES_BUILT_DESCRIPTION
                        if path.startswith(SERIES_BUILT)
                        else UFMT_DESCRIPTION
                    ),
                    text,
                    formatted,
                )
            )
    return messages


def text_checks(kind: str, paths: List[str]) -> List[LintMessage]:
    messages = []
    for path in paths:
        text = (REPO / path).read_text()
        code = kind.upper()
        if kind == "newlines":
            if text and not text.endswith("\n") or text.endswith("\n\n"):
                fixed = text.rstrip("\n") + "\n"
                description = "File must end in exactly one newline."
                messages.append(
                    LintMessage(
                        path,
                        None,
                        None,
                        code,
                        "error",
                        "newline",
                        description,
                        text,
                        fixed,
                    )
                )
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if kind == "spaces" and line != line.rstrip():
                column = len(line.rstrip()) + 1
                messages.append(
                    LintMessage(
                        path,
                        number,
                        column,
                        code,
                        "error",
                        "trailing-space",
                        "Trailing whitespace.",
                    )
                )
            if kind == "tabs" and "\t" in line:
                column = line.index("\t") + 1
                messages.append(
                    LintMessage(
                        path,
                        number,
                        column,
                        code,
                        "error",
                        "tab",
                        "Tab; indent with spaces.",
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
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
        "patches",
    )
    parser.add_argument("linter", choices=linters)
    parser.add_argument(
        "--dry-run", default="0", help="for init: 1 to only print the pip command"
    )
    parser.add_argument("args", nargs="*")
    args = parser.parse_intermixed_args()
    if args.linter == "init":
        init(args.args, args.dry_run == "1")
        return
    paths = read_paths(args.args)
    # lintrunner reads this process's stdout as lint messages, one JSON object per line, so
    # whatever a linter prints on the way goes to stderr: the patches linter's overlay prints
    # its progress when it first checks a wheel, before its result is in the build cache. (The
    # linters' own subprocesses capture their output, so Python's stdout is the one to redirect.)
    with contextlib.redirect_stdout(sys.stderr):
        messages = run_linter(args.linter, paths)
    emit(messages)


def run_linter(linter: str, paths: List[str]) -> List[LintMessage]:
    if linter == "flake8":
        return flake8(paths)
    if linter == "clang-format":
        return clang_format(paths)
    if linter == "mypy":
        return mypy(paths)
    if linter == "ufmt":
        return ufmt(paths)
    if linter == "patches":
        import patch_series  # next to this file, so on sys.path

        return patch_series.lint([pathlib.Path(p) for p in paths])
    return text_checks(linter, paths)


if __name__ == "__main__":
    main()
