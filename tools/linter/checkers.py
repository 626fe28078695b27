"""The style checkers that both the file linters and the patch series linter run, with
the repository's settings: flake8 (.flake8), clang-format (.clang-format), and PyTorch
2.1's UFMT (black + usort).
"""

import pathlib
import re
import subprocess
import sys
from typing import List

from lint_message import emit, LintMessage, LintSeverity, make_message, REPO


def run_tool(code: str, cmd: List[str]) -> subprocess.CompletedProcess:
    """Run a linter's command in the repository; if it cannot start, say so and exit."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    except OSError as e:
        emit(
            [
                make_message(
                    code, "command-failed", f"{cmd[0]}: {e}; run lintrunner init"
                )
            ]
        )
        sys.exit(0)


def parse_errors(code: str, pattern: re.Pattern[str], output: str) -> List[LintMessage]:
    """Make an error of each line of ``output`` that ``pattern`` matches.

    ``pattern`` has the groups path, line and message, and may have col, name (the error's
    name is "error" where it has none) and severity (a line whose severity is not "error" is
    left out).
    """
    errors = []
    for line in output.splitlines():
        match = pattern.match(line)
        if match and match.groupdict().get("severity", "error") == "error":
            errors.append(
                make_message(
                    code,
                    match.groupdict().get("name") or "error",
                    match["message"],
                    path=match["path"],
                    line=int(match["line"]),
                    char=int(match["col"]) if "col" in pattern.groupindex else None,
                )
            )
    return errors


FLAKE8_ERROR = re.compile(
    r"^(?P<path>.*?):(?P<line>\d+):(?P<col>\d+): (?P<name>\S+) (?P<message>.*)$"
)


def run_flake8(paths: List[str]) -> List[LintMessage]:
    result = run_tool(
        "FLAKE8",
        [sys.executable, "-m", "flake8", "--config", str(REPO / ".flake8"), *paths],
    )
    messages = parse_errors("FLAKE8", FLAKE8_ERROR, result.stdout)
    if result.returncode not in (0, 1) or (result.returncode == 1 and not messages):
        messages.append(make_message("FLAKE8", "command-failed", result.stderr.strip()))
    return messages


def check_clang_format(path: str, text: str, description: str) -> List[LintMessage]:
    """Return a "format" message for ``text``, the file ``path``, if clang-format would change it."""
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
            make_message(
                "CLANGFORMAT", "command-failed", result.stderr.strip(), path=path
            )
        ]
    if result.stdout == text:
        return []
    return [
        make_message(
            "CLANGFORMAT",
            "format",
            description,
            severity=LintSeverity.WARNING,
            path=path,
            original=text,
            replacement=result.stdout,
        )
    ]


# PyTorch 2.1's UFMT linter (black + usort through ufmt, pinned in requirements-lint.txt as its
# .lintrunner.toml pins them) with its settings: pyproject.toml's [tool.black] sets only these
# target versions (black's default line length, 88), and there is no [tool.usort].
BLACK_TARGET_VERSIONS = ("PY38", "PY39", "PY310", "PY311")


def format_with_ufmt(path: str, text: str) -> str:
    """Format ``text`` as PyTorch's UFMT linter would format the file ``path`` of the PyTorch tree.

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
