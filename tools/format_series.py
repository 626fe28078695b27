#!/usr/bin/env python3
"""Write a branch's commits as a patch series for patches/BASE/.

Runs ``git format-patch --zero-commit --no-signature`` on the commits
``BASE_REF..HEAD`` of a PyTorch checkout, as the series in patches/ are made.
With --function-context, the diffs of libtorch's .cpp files (all of torch/csrc
but init.cpp) show every function they change whole, and the rest of each
patch keeps git's usual three lines of context: the overlay carries a change
to a function that libtorch already has by compiling the patched function from
its hunk (see torch_overlay/series.py), which needs all of it, and reviewers
of the Python, binding and test diffs are spared whole functions of context.

  tools/format_series.py ~/pytorch v2.14.1 patches/v2.14.1 --function-context
"""

import argparse
import pathlib
import re
import subprocess
import sys
import tempfile
from typing import List

_FILE_DIFF = re.compile(r"^diff --git a/(?P<path>\S+) b/", re.M)


def shows_whole_functions(path: str) -> bool:
    """Return whether the diff of ``path`` shows each function it changes whole.

    libtorch's sources, whose changed functions the overlay compiles from the
    hunks; init.cpp's bindings are generated from their ``.def`` blocks.
    """
    return (
        path.startswith("torch/csrc/")
        and path.endswith(".cpp")
        and not path.endswith("/init.cpp")
    )


def format_patch(
    tree: pathlib.Path, base_ref: str, out: pathlib.Path, *extra: str
) -> List[pathlib.Path]:
    cmd = [
        "git",
        "-C",
        str(tree),
        "format-patch",
        "--quiet",
        "--zero-commit",
        "--no-signature",
        *extra,
    ]
    subprocess.run(cmd + ["-o", str(out), f"{base_ref}..HEAD"], check=True)
    return sorted(out.glob("*.patch"))


def split(patch: str) -> List[str]:
    """The message, then one part per file diff."""
    starts = [m.start() for m in _FILE_DIFF.finditer(patch)]
    return [patch[i:j] for i, j in zip([0] + starts, starts + [len(patch)])]


def splice(plain: str, whole: str) -> str:
    """``plain`` with the diffs of the files that show whole functions taken from ``whole``."""
    plain_parts, whole_parts = split(plain), split(whole)
    if len(plain_parts) != len(whole_parts):
        raise SystemExit(
            "format_series: the two format-patch runs disagree on the files a patch changes"
        )
    parts = [plain_parts[0]]
    for mine, theirs in zip(plain_parts[1:], whole_parts[1:]):
        match = _FILE_DIFF.match(mine)
        assert match is not None and match.group(0) == _FILE_DIFF.match(theirs).group(0)  # type: ignore[union-attr]
        parts.append(theirs if shows_whole_functions(match.group("path")) else mine)
    return "".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "tree", type=pathlib.Path, help="the checkout whose HEAD ends the series"
    )
    parser.add_argument(
        "base_ref", help="the commit the series starts from (the release tag)"
    )
    parser.add_argument(
        "out", type=pathlib.Path, help="where to write the patches (emptied first)"
    )
    parser.add_argument(
        "--function-context",
        action="store_true",
        help="show the functions that the diffs of libtorch's .cpp files change whole (the series of a base with the API)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.patch"):
        old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        plain = format_patch(args.tree, args.base_ref, pathlib.Path(tmp) / "plain")
        whole = (
            format_patch(
                args.tree,
                args.base_ref,
                pathlib.Path(tmp) / "whole",
                "--function-context",
            )
            if args.function_context
            else plain
        )
        for mine, theirs in zip(plain, whole):
            (args.out / mine.name).write_text(
                splice(mine.read_text(), theirs.read_text())
            )
    print(f"wrote {len(plain)} patches to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
