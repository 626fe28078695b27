"""The patch series linter: what a reviewer of the stack checks before reading the code.

For each series in patches/BASE/ (lintrunner passes the patch files), against the
wheel of its base (the venv of scripts/overlay install --base BASE):

* HEADER: every patch has an author, a date, a "[area] Subject", a body that says
  why and a "Test Plan:", in PyTorch's own form: upstream PRs are cited in the body,
  and no trailer but PyTorch's (Fixes, Co-authored-by) ends the message;
* SCOPE: each patch touches only what its subject's area covers;
* NOISE: no hunk only re-formats a line, and no added line has trailing
  whitespace or tabs;
* APPLY: the series applies to the wheel's base files where the wheel has them,
  and the overlay can carry it: every function of a .cpp file that the series
  adds or changes shown whole, every function of libtorch that it changes
  reached by every caller in the wheel's libraries (a relocation, or its
  binding where its signature changes), init.cpp's bindings shown whole, and
  no layout of a class of the wheel changed other than by a data member that
  a shim carries;
* AM: the series applies with `git am`, commit by commit, to a tree of the base's files:
  the wheel's own, and the .cpp files that the wheel lacks from the directory that
  PATCH_SERIES_SNAPSHOT names (a PyTorch tree, or the stored snapshot the series was
  made against), if it is set; without it their hunks are left out of `git am`, and
  only APPLY checks them;
* AGREE: test/distributed/BASE holds exactly what the series adds under test/distributed;
* FLAKE8 / CLANGFORMAT: the Python and C++ the series adds, checked in place in
  the patched files with the repository's flake8 and clang-format settings;
* UFMT: no line the series adds to a Python file or stub is one that PyTorch's UFMT
  linter (black + usort) would change in the patched file. Upstream's own lines are
  not checked (v2.1.2's distributed.py and _distributed_c10d.pyi are UFMT-clean).
"""

import difflib
import email.parser
import os
import pathlib
import re
import subprocess
import tempfile
from typing import Dict, List, Optional, Set, Tuple

import unidiff

# From this script's folder, as lintrunner runs it; torch_overlay is the package that
# scripts/lint's venv, where this runs (lintrunner's python3), has installed.
from checkers import check_clang_format, format_with_ufmt, run_flake8
from lint_message import (
    lint_and_emit,
    LintMessage,
    make_argument_parser,
    make_message,
    REPO,
)
from torch_overlay import bases, build, callers, carriage, install, series, wheel
from torch_overlay.reporting import OverlayError

CODE = "PATCHES"
TEST_PLAN = re.compile(r"^Test Plan:", re.M)
# A trailer ("Token: value") in a commit message's last paragraph, and the ones PyTorch uses.
TRAILER = re.compile(r"^(?P<token>[A-Za-z][A-Za-z-]*): \S")
PYTORCH_TRAILERS = ("Fixes", "Co-authored-by")
SUBJECT = re.compile(r"^\[PATCH(?: \d+/\d+)?\] \[(?P<area>[^\]]+)\] (?P<title>\S.*)$")
# What each subject area may touch. A "[DDP] Test ..." patch holds tests only; a
# [DDP] change may reach into the reducer it runs on, and brings its tests along.
# c10d: its C++, its bindings' stub, and its Python front end.
C10D = (
    "torch/csrc/distributed/c10d/",
    "torch/_C/_distributed_c10d.pyi",
    "torch/distributed/distributed_c10d.py",
)
# Upstream's own distributed tests live in torch.testing._internal.distributed.
TESTS = ("test/distributed/", "torch/testing/_internal/distributed/")
SCOPES: Dict[str, Tuple[str, ...]] = {
    # DDP is the reducer's only caller, and follows a change of its interface.
    "c10d": C10D + ("torch/nn/parallel/distributed.py",) + TESTS,
    "DDP": ("torch/nn/parallel/", "torch/distributed/") + C10D + TESTS,
    "DDP test": TESTS,
}


def make_patch_error(
    patch: pathlib.Path, name: str, description: str, line: Optional[int] = None
) -> LintMessage:
    """Make an error in ``patch``, at ``line`` of the patch file if given."""
    return make_message(
        CODE, name, description, path=str(patch.relative_to(REPO)), line=line
    )


def lint_header(patch: pathlib.Path, text: str) -> List[LintMessage]:
    # format-patch output is one mbox message; drop the "From <sha>" separator line.
    headers = email.parser.Parser().parsestr(text.split("\n", 1)[1], headersonly=True)
    found = []
    for field in ("From", "Date", "Subject"):
        if not headers.get(field):
            found.append(make_patch_error(patch, "header", f"no {field}: header"))
    subject = " ".join((headers.get("Subject") or "").split())
    match = SUBJECT.match(subject)
    if not match:
        found.append(
            make_patch_error(
                patch,
                "subject",
                f"subject {subject!r} is not '[area] Title', e.g. '[c10d] Add ...'",
            )
        )
    body = text.split("\n\n", 1)[1].split("\n---\n", 1)[0] if "\n\n" in text else ""
    paragraphs = [p for p in body.strip().split("\n\n") if p.strip()]
    why = [p for p in paragraphs if not TEST_PLAN.match(p)]
    if sum(len(p.splitlines()) for p in why) < 2:
        found.append(
            make_patch_error(
                patch, "body", "the commit message has no body that explains why"
            )
        )
    if not TEST_PLAN.search(body):
        found.append(
            make_patch_error(
                patch, "test-plan", "the commit message has no 'Test Plan:'"
            )
        )
    for line in paragraphs[-1].splitlines() if paragraphs else ():
        trailer = TRAILER.match(line)
        if trailer and trailer["token"] not in PYTORCH_TRAILERS:
            found.append(
                make_patch_error(
                    patch,
                    "trailer",
                    f"{trailer['token']}: is not a PyTorch trailer; cite upstream PRs in the body, as #N",
                )
            )
    return found


def find_scope(subject_match) -> Tuple[str, ...]:
    area = subject_match["area"]
    if area == "DDP" and subject_match["title"].startswith("Test"):
        area = "DDP test"
    return SCOPES.get(area, ())


def lint_scope(
    patch: pathlib.Path, text: str, patch_set: unidiff.PatchSet
) -> List[LintMessage]:
    header = re.search(r"^Subject: (.*(?:\n .*)*)", text, re.M)
    match = SUBJECT.match(" ".join(header.group(1).split())) if header else None
    if not match:
        return []  # lint_header reports it
    allowed = find_scope(match)
    if not allowed:
        return [
            make_patch_error(
                patch,
                "scope",
                f"unknown area [{match['area']}]; known: {', '.join(SCOPES)}",
            )
        ]
    return [
        make_patch_error(
            patch,
            "scope",
            f"{f.path} is outside what [{match['area']}] {match['title']!r} covers: {', '.join(allowed)}",
        )
        for f in patch_set
        if not f.path.startswith(allowed)
    ]


def make_reformat_key(value: str, keep_indentation: bool) -> str:
    """Return what a line is, whitespace aside, or all but its indentation."""
    indentation = value[: len(value) - len(value.lstrip())] if keep_indentation else ""
    return indentation + "".join(value.split())


def changes_blocks(hunk: unidiff.Hunk) -> bool:
    """Tell whether a C++ hunk opens or closes a block that it did not have before."""

    def braces(lines):
        return {
            line.value.strip()
            for line in lines
            if line.value.strip().endswith("{") or line.value.strip().startswith("}")
        }

    added = braces(line for line in hunk if line.is_added)
    return bool(added - braces(line for line in hunk if line.is_removed))


def lint_noise(patch: pathlib.Path, patch_set: unidiff.PatchSet) -> List[LintMessage]:
    found = []
    for patched_file in patch_set:
        for hunk in patched_file:
            # In Python, indentation is block structure: a line that comes back with
            # another indentation moved into another block, which is no reformat. So
            # in C++, where the hunk adds a block around it.
            keep_indentation = patched_file.path.endswith(
                (".py", ".pyi")
            ) or changes_blocks(hunk)
            removed = {
                make_reformat_key(line.value, keep_indentation)
                for line in hunk
                if line.is_removed
            }
            # A line that comes back unchanged elsewhere in the hunk moved; that is no reformat.
            moved = {line.value for line in hunk if line.is_removed}
            for line in hunk:
                if not line.is_added:
                    continue
                value = line.value.rstrip("\n")
                if value != value.rstrip() or "\t" in value:
                    found.append(
                        make_patch_error(
                            patch,
                            "whitespace",
                            "added line has trailing whitespace or a tab",
                            line.diff_line_no,
                        )
                    )
                if (
                    line.value.strip()
                    and make_reformat_key(line.value, keep_indentation) in removed
                    and line.value not in moved
                ):
                    found.append(
                        make_patch_error(
                            patch,
                            "reformat",
                            f"{patched_file.path}: this line only re-formats a line the hunk removes",
                            line.diff_line_no,
                        )
                    )
    return found


def map_added_lines(
    patch_sets: Dict[pathlib.Path, unidiff.PatchSet], path: str
) -> Dict[int, Tuple[pathlib.Path, int]]:
    """Map each line in the final patched ``path`` to (patch, line in the patch), for every line the series adds.

    Follows each added line through the later patches: their hunks shift it, keep it as
    context, or remove it (then it is not in the final file). A line that a later patch
    changes counts as that patch's.
    """
    lines: Dict[int, Tuple[pathlib.Path, int]] = {}
    for patch, patch_set in patch_sets.items():
        for patched_file in patch_set:
            if patched_file.path != path:
                continue
            hunks = list(patched_file)
            after: Dict[int, Tuple[pathlib.Path, int]] = {}
            for line_no, origin in lines.items():
                if any(
                    h.source_start <= line_no < h.source_start + h.source_length
                    for h in hunks
                ):
                    continue  # the hunk that covers it says what becomes of it
                # A hunk shifts the lines after its source range; one with no source
                # lines ("-N,0") inserts after line N.
                shift = sum(
                    h.target_length - h.source_length
                    for h in hunks
                    if line_no >= h.source_start + max(h.source_length, 1)
                )
                after[line_no + shift] = origin
            for hunk in hunks:
                for line in hunk:
                    if (
                        line.is_added
                        and line.target_line_no is not None
                        and line.diff_line_no is not None
                    ):
                        after[line.target_line_no] = (patch, line.diff_line_no)
                    elif (
                        line.is_context
                        and line.source_line_no in lines
                        and line.target_line_no is not None
                    ):
                        after[line.target_line_no] = lines[line.source_line_no]
            lines = after
    return lines


def find_changed_lines(before: str, after: str) -> Set[int]:
    """Return the lines of ``before`` (from 1) that turning it into ``after`` changes or removes.

    Lines inserted between two lines count for both of them.
    """
    changed: Set[int] = set()
    matcher = difflib.SequenceMatcher(
        None, before.splitlines(), after.splitlines(), autojunk=False
    )
    for tag, i1, i2, _, _ in matcher.get_opcodes():
        if tag == "insert":
            changed |= {i1, i1 + 1}
        elif tag != "equal":
            changed |= set(range(i1 + 1, i2 + 1))
    return changed


def lint_ufmt(
    tree: pathlib.Path, repo_path: str, added: Dict[int, Tuple[pathlib.Path, int]]
) -> List[LintMessage]:
    """Report the lines the series adds to ``repo_path`` that PyTorch's black and usort would change."""
    text = (tree / repo_path).read_text()
    try:
        formatted = format_with_ufmt(repo_path, text)
    except Exception as e:
        # Black and usort raise their own errors for code they cannot parse.
        description = f"black/usort cannot format the patched {repo_path}: {type(e).__name__}: {e}"
        return [make_message(CODE, "ufmt", description, path="patches")]
    found = []
    for n in sorted(find_changed_lines(text, formatted) & set(added)):
        patch, diff_line = added[n]
        description = (
            f"{repo_path}:{n} is not formatted as PyTorch's UFMT linter (black + usort) formats it; "
            "run black and usort on the patched file and carry the change into the patch"
        )
        found.append(make_patch_error(patch, "ufmt", description, diff_line))
    return found


def lint_added_code(
    tree: pathlib.Path, patches: series.Series, patch_sets
) -> List[LintMessage]:
    found = []
    for repo_path in patches.applied:
        added = map_added_lines(patch_sets, repo_path)
        # PyTorch's flake8 settings exclude stubs (*.pyi).
        if repo_path.endswith(".py"):
            for m in run_flake8([str(tree / repo_path)]):
                if m.line in added:
                    patch, diff_line = added[m.line]
                    found.append(
                        make_patch_error(
                            patch,
                            f"flake8-{m.name}",
                            f"{repo_path}:{m.line}: {m.description}",
                            diff_line,
                        )
                    )
        if repo_path.endswith((".py", ".pyi")):
            found += lint_ufmt(tree, repo_path, added)
        elif repo_path.endswith(series.HEADER_SUFFIXES):
            text = (tree / repo_path).read_text()
            for m in check_clang_format(repo_path, text, ""):
                for n in sorted(
                    find_changed_lines(text, m.replacement or "") & set(added)
                ):
                    patch, diff_line = added[n]
                    description = (
                        f"{repo_path}:{n} is not in PyTorch's clang-format style"
                    )
                    found.append(
                        make_patch_error(patch, "clang-format", description, diff_line)
                    )
    # The functions the series adds and changes in the sources the wheel lacks, whole.
    functions = patches.declarations + patches.replaced + patches.added
    source = (
        "namespace c10d {\n\n"
        + "\n".join(f.text for f in functions)
        + "\n} // namespace c10d\n"
    )
    for m in check_clang_format(series.REDUCER_CPP, source, ""):
        found.append(
            make_message(
                CODE,
                "clang-format",
                "the functions the series adds to and changes in "
                f"{', '.join(sorted({f.path for f in functions}))} are not in PyTorch's "
                "clang-format style",
                path="patches",
            )
        )
    return found


def lint_agreement(
    base: bases.Base, patch_files: List[pathlib.Path], patches: series.Series
) -> List[LintMessage]:
    found: List[LintMessage] = []
    with tempfile.TemporaryDirectory() as tmp:
        for patch in patch_files:
            command = ["git", "apply", "--include=test/distributed/*", str(patch)]
            result = subprocess.run(command, cwd=tmp, capture_output=True, text=True)
            if result.returncode != 0:
                description = f"its test/ hunks do not apply after the patches before it: {result.stderr.strip()}"
                return found + [make_patch_error(patch, "apply", description)]
        for added in pathlib.Path(tmp).rglob("*"):
            if not added.is_file():
                continue
            relative = str(added.relative_to(tmp))
            mine = base.repo_path(REPO, relative)
            if not mine.is_file() or mine.read_bytes() != added.read_bytes():
                found.append(
                    make_message(
                        CODE,
                        "agree",
                        f"{mine.relative_to(REPO)} differs from the {relative} that the {base.name} series adds; "
                        "change both together",
                        path=str(mine.relative_to(REPO)),
                    )
                )
    return found


# Where the .cpp files of a base's tree are, for AM: a PyTorch checkout, or a snapshot.
SNAPSHOT_ENV = "PATCH_SERIES_SNAPSHOT"


def lint_git_am(
    torch: wheel.Torch, patch_files: List[pathlib.Path], patches: series.Series
) -> List[LintMessage]:
    """Report the first patch that `git am` cannot apply on top of the ones before it, if any."""
    snapshot = os.environ.get(SNAPSHOT_ENV)
    with tempfile.TemporaryDirectory() as tmp:
        tree = pathlib.Path(tmp)
        files = install.read_originals(torch, patches.applied)
        excluded = []
        for path in sorted(patches.base_lines):
            if snapshot and (pathlib.Path(snapshot) / path).is_file():
                files[path] = (pathlib.Path(snapshot) / path).read_bytes()
            else:
                excluded.append(f"--exclude={path}")
        for path, data in files.items():
            (tree / path).parent.mkdir(parents=True, exist_ok=True)
            # As the sources have it, as the overlay applies the series to it.
            (tree / path).write_bytes(wheel.unwrap_header(data))
        git = [
            "git",
            "-c",
            "user.name=lint",
            "-c",
            "user.email=lint@localhost",
            "-C",
            str(tree),
        ]
        for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
            subprocess.run(git + cmd, check=True, capture_output=True)
        for patch in patch_files:
            result = subprocess.run(
                git + ["am", "-q", *excluded, str(patch)],
                capture_output=True,
                text=True,
            )
            if result.returncode != 0:
                left_out = (
                    f" (its .cpp hunks left out: set {SNAPSHOT_ENV} to check them too)"
                    if excluded
                    else ""
                )
                description = f"git am fails on the base's files after the patches before it{left_out}: {result.stderr.strip()}"
                return [make_patch_error(patch, "am", description)]
    return []


def find_base_torch(base: bases.Base) -> wheel.Torch:
    """Return the torch of ``base``'s overlay venv: this interpreter's, or the venv scripts/overlay makes for it."""
    torch = wheel.Torch.find()
    if bases.parse(torch.version) == base.release:
        return torch
    venv = base.venv(REPO)
    found = sorted(venv.glob("lib/python*/site-packages"))
    if not found:
        raise OverlayError(
            f"the {base.name} series is linted against torch {base.torch}, which is not in {venv}: "
            f"run scripts/overlay install --base {base.name}"
        )
    return wheel.Torch.at(found[0])


def lint(paths: List[pathlib.Path]) -> List[LintMessage]:
    by_base: Dict[str, List[pathlib.Path]] = {}
    for path in sorted(REPO / p for p in paths):
        by_base.setdefault(path.parent.name, []).append(path)
    found: List[LintMessage] = []
    for name, patch_files in by_base.items():
        if name not in bases.BASES:
            found.append(
                make_message(
                    CODE,
                    "base",
                    f"no base {name!r}: the series go in patches/BASE/, BASE one of {', '.join(bases.BASES)}",
                    path=str(patch_files[0].parent.relative_to(REPO)),
                )
            )
            continue
        found += lint_series(bases.BASES[name], patch_files)
    return found


def lint_carriage(torch: wheel.Torch, patches: series.Series) -> List[LintMessage]:
    """Check, before anything is built, that the overlay can reach libtorch's callers of what the series changes.

    Without a build, a changed function counts as redirected by its relocations
    (see torch_overlay/carriage.py) whatever its signature, and, where its first
    line changed, as carried through its binding too: both must then hold.
    Overlay install makes the exact check on the built extension.
    """
    lib_dir = torch.site_packages / "torch" / "lib"
    headers = torch.site_packages / "torch" / "include" / build.C10D_HEADERS
    redirected = [
        t.symbol for t in build.find_prologue_targets(headers, lib_dir, patches)
    ]
    through_binding = []
    for function in patches.replaced:
        defined = callers.find_definitions(lib_dir, f"c10d::{function.name}(")
        redirected += [symbol for symbol, _, _ in defined]
        if function.lines[0].patch is not None:
            through_binding += [symbol for symbol, _, _ in defined]
    carriage.check_carriage(
        torch,
        carriage.Carriage(redirected=redirected, through_binding=through_binding),
    )
    return []


def lint_series(base: bases.Base, patch_files: List[pathlib.Path]) -> List[LintMessage]:
    found: List[LintMessage] = []
    patch_sets = {}
    for patch in patch_files:
        text = patch.read_text()
        patch_sets[patch] = unidiff.PatchSet(text)
        found += lint_header(patch, text)
        found += lint_scope(patch, text, patch_sets[patch])
        found += lint_noise(patch, patch_sets[patch])
    try:
        torch = find_base_torch(base)
        patches = series.read_series(base.patches(REPO), torch.site_packages)
        sources = install.read_originals(torch, patches.applied)
        with tempfile.TemporaryDirectory() as tmp:
            patched = install.apply_patches(pathlib.Path(tmp), patches, sources)
            # Refuses a layout change of a class of the wheel that no shim carries.
            install.strip_added_members(sources, patched)
            found += lint_added_code(pathlib.Path(tmp), patches, patch_sets)
        found += lint_carriage(torch, patches)
    except (series.SeriesError, OverlayError, callers.CallersError) as e:
        return found + [
            make_message(CODE, "apply", str(e), path=f"patches/{base.name}")
        ]
    return (
        found
        + lint_git_am(torch, patch_files, patches)
        + lint_agreement(base, patch_files, patches)
    )


def main() -> None:
    args = make_argument_parser(__doc__).parse_args()
    lint_and_emit(lambda: lint([pathlib.Path(p) for p in args.paths]))


if __name__ == "__main__":
    main()
