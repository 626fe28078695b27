"""lintrunner init: install the linters from requirements files into this Python."""

import argparse
import subprocess
import sys
from typing import List

from lint_message import REPO


def init(requirements: List[str], dry_run: bool) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    for path in requirements:
        cmd += ["-r", str(REPO / path)]
    if dry_run:
        print("would run: " + " ".join(cmd))
        return
    subprocess.run(cmd, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--dry-run",
        default="0",
        help="1 to only print the pip command (lintrunner's {{DRYRUN}})",
    )
    parser.add_argument("requirements", nargs="+", help="requirements files")
    args = parser.parse_args()
    init(args.requirements, args.dry_run == "1")


if __name__ == "__main__":
    main()
