"""The lint adapters and the patch series linter find what they are for."""

import ast
import graphlib
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

import pytest
import unidiff

from conftest import BASE, git, GIT, load_module, PATCHES, REPO

LINTER = REPO / "tools" / "linter"
# As lintrunner runs them, the linters import their shared modules (lint_message, checkers)
# from their own folder: each is loaded under its name, after those that it imports.
lint_message, checkers, mypy_linter, patch_series, text_linter, ufmt_linter = (
    load_module(LINTER / f"{name}.py", name, register=True)
    for name in (
        "lint_message",
        "checkers",
        "mypy_linter",
        "patch_series",
        "text_linter",
        "ufmt_linter",
    )
)

REAL = sorted(PATCHES.glob("*.patch"))
HEADER = """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: A Person <a@example.com>
Date: Wed, 2 Dec 2026 14:00:00 +0000
Subject: [PATCH] {subject}

{body}
---
 {path} | 2 +-
 1 file changed, 1 insertion(+), 1 deletion(-)

diff --git a/{path} b/{path}
index 0000000..1111111 100644
--- a/{path}
+++ b/{path}
@@ -1,3 +1,3 @@
 context
-{old}
+{new}
 context
--
2.39.5
"""
WHY = "Why this change is needed (#113580),\nin more than one line.\n\nTest Plan:\npython test/x.py"


def fake(
    tmp_path,
    subject="[c10d] Add a thing",
    body=WHY,
    path="torch/csrc/distributed/c10d/reducer.cpp",
    old="int x = 1;",
    new="int x = 2;",
):
    patch = tmp_path / "0001-fake.patch"
    patch.write_text(
        HEADER.format(subject=subject, body=body, path=path, old=old, new=new)
    )
    # make_message() reports paths relative to the repository.
    return patch, patch.read_text()


def names(messages):
    return sorted(m.name for m in messages)


def test_the_series_is_clean():
    assert patch_series.lint([p.relative_to(REPO) for p in REAL]) == []


def test_headers(tmp_path, monkeypatch):
    monkeypatch.setattr(patch_series, "REPO", tmp_path)
    patch, text = fake(tmp_path)
    assert patch_series.lint_header(patch, text) == []
    patch, text = fake(tmp_path, body="Short.")
    assert names(patch_series.lint_header(patch, text)) == ["body", "test-plan"]
    patch, text = fake(
        tmp_path, body=WHY + "\nUpstream-Ref: https://github.com/pytorch/pytorch/pull/1"
    )
    found = patch_series.lint_header(patch, text)
    assert (
        names(found) == ["trailer"]
        and "Upstream-Ref: is not a PyTorch trailer" in found[0].description
    )
    patch, text = fake(tmp_path, body=WHY + "\n\nFixes #1")
    assert patch_series.lint_header(patch, text) == []
    patch, text = fake(tmp_path, subject="Add a thing without an area")
    assert names(patch_series.lint_header(patch, text)) == ["subject"]


def test_scope(tmp_path, monkeypatch):
    monkeypatch.setattr(patch_series, "REPO", tmp_path)
    patch, text = fake(tmp_path, path="torch/nn/parallel/scatter_gather.py")
    found = patch_series.lint_scope(patch, text, unidiff.PatchSet(text))
    assert names(found) == ["scope"] and "outside what [c10d]" in found[0].description
    # The reducer's caller follows a change of the reducer in the same commit.
    patch, text = fake(tmp_path, path="torch/nn/parallel/distributed.py")
    assert patch_series.lint_scope(patch, text, unidiff.PatchSet(text)) == []
    # So does c10d's Python front end, where _reconfigure() counts.
    patch, text = fake(tmp_path, path="torch/distributed/distributed_c10d.py")
    assert patch_series.lint_scope(patch, text, unidiff.PatchSet(text)) == []
    patch, text = fake(
        tmp_path,
        subject="[DDP] Add a thing",
        path="torch/csrc/distributed/c10d/reducer.cpp",
    )
    assert patch_series.lint_scope(patch, text, unidiff.PatchSet(text)) == []
    patch, text = fake(
        tmp_path, subject="[DDP] Test a thing", path="torch/nn/parallel/distributed.py"
    )
    assert names(patch_series.lint_scope(patch, text, unidiff.PatchSet(text))) == [
        "scope"
    ]
    patch, text = fake(
        tmp_path, subject="[DDP] Test a thing", path="test/distributed/test_x.py"
    )
    assert patch_series.lint_scope(patch, text, unidiff.PatchSet(text)) == []


def test_noise(tmp_path, monkeypatch):
    monkeypatch.setattr(patch_series, "REPO", tmp_path)
    patch, text = fake(tmp_path, old="int x = 1;", new="int  x =  1;")
    assert names(patch_series.lint_noise(patch, unidiff.PatchSet(text))) == ["reformat"]
    patch, text = fake(tmp_path, new="int x = 2; ")
    assert names(patch_series.lint_noise(patch, unidiff.PatchSet(text))) == [
        "whitespace"
    ]
    patch, text = fake(tmp_path)
    assert patch_series.lint_noise(patch, unidiff.PatchSet(text)) == []
    # In Python, a statement that moves out of a nested block changes what the code does.
    patch, text = fake(
        tmp_path,
        path="torch/nn/parallel/distributed.py",
        old="        f(x)",
        new="    f(x)",
    )
    assert patch_series.lint_noise(patch, unidiff.PatchSet(text)) == []
    patch, text = fake(
        tmp_path,
        path="torch/nn/parallel/distributed.py",
        old="    f(x, y)",
        new="    f(x,y)",
    )
    assert names(patch_series.lint_noise(patch, unidiff.PatchSet(text))) == ["reformat"]
    # In C++, a statement that moves into a block that the hunk adds.
    patch, text = fake(tmp_path, old="  f(x);", new="  if (y) {")
    text = text.replace("@@ -1,3 +1,3 @@", "@@ -1,3 +1,5 @@").replace(
        "+  if (y) {\n", "+  if (y) {\n+    f(x);\n+  }\n"
    )
    assert patch_series.lint_noise(patch, unidiff.PatchSet(text)) == []
    # Without a new block, a line indented anew is a reformat.
    patch, text = fake(tmp_path, old="  f(x);", new="    f(x);")
    assert names(patch_series.lint_noise(patch, unidiff.PatchSet(text))) == ["reformat"]


def test_test_file_must_agree_with_the_series(tmp_path, monkeypatch):
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "patches", copy / "patches")
    test_file = BASE.test_file(copy)
    test_file.parent.mkdir(parents=True)
    test_file.write_text(BASE.test_file(REPO).read_text() + "# drift\n")
    monkeypatch.setattr(patch_series, "REPO", copy)
    series = patch_series.series.read_series(
        PATCHES, patch_series.wheel.Torch.find().site_packages
    )
    found = patch_series.lint_agreement(BASE, REAL, series)
    assert names(found) == ["agree"]
    assert (
        found[0].path
        == f"test/distributed/{BASE.name}/test_ddp_update_process_group.py"
    )
    # A test hunk that does not apply is reported, not a crash.
    broken, _ = fake(
        copy,
        subject="[DDP] Test a thing",
        path="test/distributed/test_ddp_update_process_group.py",
    )
    found = patch_series.lint_agreement(BASE, REAL + [broken], series)
    assert (found[-1].name, found[-1].path) == ("apply", broken.name)


def test_git_am_commit_by_commit(tmp_path, monkeypatch):
    torch = patch_series.wheel.Torch.find()
    series = patch_series.series.read_series(PATCHES, torch.site_packages)
    # Without a snapshot, the .cpp hunks are left out, and the rest applies.
    monkeypatch.delenv(patch_series.SNAPSHOT_ENV, raising=False)
    assert patch_series.lint_git_am(torch, REAL, series) == []
    # With one whose reducer.cpp is not the base's, the first patch that changes it fails.
    snapshot = tmp_path / "snapshot"
    for path in sorted(series.base_lines):
        (snapshot / path).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / path).write_text("// not the base's file\n")
    monkeypatch.setenv(patch_series.SNAPSHOT_ENV, str(snapshot))
    found = patch_series.lint_git_am(torch, REAL, series)
    assert names(found) == ["am"] and found[0].path.endswith(REAL[0].name)
    assert "git am fails on the base's files" in found[0].description


def test_adapter_prints_only_lint_messages_on_stdout(tmp_path, monkeypatch, capsys):
    # What the overlay prints while the patches linter checks a wheel for the first time.
    def lint(paths):
        print(
            "[overlay] checking that nothing in libtorch but the Python bindings calls Reducer::reset_state"
        )
        return [
            lint_message.make_message(
                "PATCHES", "apply", "it does not apply", path=str(paths[0])
            )
        ]

    monkeypatch.setattr(patch_series, "lint", lint)
    paths = tmp_path / "paths"
    paths.write_text(f"{REAL[0].relative_to(REPO)}\n")
    monkeypatch.setattr(sys, "argv", ["patch_series.py", f"@{paths}"])
    patch_series.main()
    out, err = capsys.readouterr()
    assert [json.loads(line)["name"] for line in out.splitlines()] == ["apply"]
    assert "[overlay] checking that nothing in libtorch" in err


def sibling_imports(path):
    """The modules of tools/linter/ that ``path`` imports, at its top or inside a function."""
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.split(".")[0])
    return imported & {p.stem for p in LINTER.glob("*.py")}


def test_the_linter_modules_import_each_other_without_a_cycle():
    graph = {path.stem: sibling_imports(path) for path in LINTER.glob("*.py")}
    assert graph["patch_series"] >= {"lint_message"}
    # CycleError names the modules of a cycle.
    graphlib.TopologicalSorter(graph).prepare()


LINTERS = tomllib.loads((REPO / ".lintrunner.toml").read_text())["linter"]
# What each linter is given to lint by the test below: a small file it lints, or for
# PATCHES a series of no base, which it reports before it reads the patch.
SAMPLES = {
    "CLANGFORMAT": ("sample.cpp", "int f();\n"),
    "PATCHES": ("patches/nobase/0001-sample.patch", None),
}
IMPORT_TIME = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(?P<module>\S+)$", re.M)


@pytest.mark.parametrize("linter", LINTERS, ids=lambda linter: linter["code"])
def test_each_linter_loads_its_modules_once(linter, tmp_path):
    """lintrunner runs the linter's script as __main__: none of its modules may import it back.

    If one did, the script would run a second time as a module of its own name, with
    classes of its own (its LintMessage is another class than __main__'s).
    """
    name, text = SAMPLES.get(linter["code"], ("sample.py", "x = 1\n"))
    path = tmp_path / name if text is not None else name
    if text is not None:
        path.write_text(text)
    (tmp_path / "paths").write_text(f"{path}\n")
    python, script, *args = [
        arg.replace("{{PATHSFILE}}", str(tmp_path / "paths"))
        for arg in linter["command"]
    ]
    assert python == "python3"
    result = subprocess.run(
        [sys.executable, "-X", "importtime", script, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert all(
        json.loads(line)["code"] == linter["code"]
        for line in result.stdout.splitlines()
    )
    imported = set(IMPORT_TIME.findall(result.stderr))
    assert "lint_message" in imported
    assert pathlib.Path(script).stem not in imported


def test_flake8_adapter(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    assert [(m.name, m.line, m.char) for m in checkers.run_flake8([str(bad)])] == [
        ("F401", 1, 1)
    ]


def test_mypy_output_gives_its_errors_and_leaves_its_notes_out():
    output = (
        'a.py:3: error: Name "x" is not defined  [name-defined]\n'
        "a.py:4: note: See https://mypy.rtfd.io\n"
        "a.py:5: error: Something without a code\n"
        "Found 2 errors in 1 file (checked 1 source file)\n"
    )
    found = checkers.parse_errors("MYPY", mypy_linter.MYPY_MESSAGE, output)
    assert [(m.path, m.line, m.char, m.name, m.description) for m in found] == [
        ("a.py", 3, None, "name-defined", 'Name "x" is not defined'),
        ("a.py", 5, None, "error", "Something without a code"),
    ]
    assert {(m.code, m.severity) for m in found} == {
        ("MYPY", lint_message.LintSeverity.ERROR)
    }


def test_clang_format_adapter():
    found = checkers.check_clang_format("x.cpp", "int  f( ){return 1;}\n", "fix it")
    assert (
        names(found) == ["format"]
        and found[0].replacement == "int f() {\n  return 1;\n}\n"
    )
    assert checkers.check_clang_format("x.cpp", "int f() {\n  return 1;\n}\n", "") == []


def test_text_checks(tmp_path, monkeypatch):
    monkeypatch.setattr(text_linter, "REPO", tmp_path)
    (tmp_path / "a.txt").write_text("x \n\ty\n\n")
    found = text_linter.check_text("spaces", ["a.txt"]) + text_linter.check_text(
        "tabs", ["a.txt"]
    )
    assert [(m.code, m.name, m.line, m.char) for m in found] == [
        ("SPACES", "trailing-space", 1, 2),
        ("TABS", "tab", 2, 1),
    ]
    assert names(text_linter.check_text("newlines", ["a.txt"])) == ["newline"]
    (tmp_path / "b.txt").write_text("fine\n")
    assert text_linter.check_text("newlines", ["b.txt"]) == []


def test_ufmt_adapter(tmp_path, monkeypatch):
    # PyTorch 2.1's settings: black's default line length (88), usort with torch first-party in torch/.
    assert checkers.format_with_ufmt("x.py", "x = {'a':1}\n") == 'x = {"a": 1}\n'
    long_call = "x = f(" + ", ".join(["argument"] * 9) + ")\n"
    assert (
        len(long_call) < 120
        and checkers.format_with_ufmt("x.py", long_call).count("\n") == 11
    )
    imports = "import torch\nimport os\nimport numpy\n"
    assert (
        checkers.format_with_ufmt("torch/x.py", imports)
        == "import os\n\nimport numpy\n\nimport torch\n"
    )
    assert (
        checkers.format_with_ufmt("test/x.py", imports)
        == "import os\n\nimport numpy\nimport torch\n"
    )
    assert (
        checkers.format_with_ufmt("x.pyi", "def f(x: int) -> None:\n    ...\n")
        == "def f(x: int) -> None: ...\n"
    )
    monkeypatch.setattr(ufmt_linter, "REPO", tmp_path)
    (tmp_path / "bad.py").write_text("x = {'a':1}\n")
    (tmp_path / "good.py").write_text('x = {"a": 1}\n')
    (tmp_path / "broken.py").write_text("def (:\n")
    found = ufmt_linter.lint_ufmt(["bad.py", "good.py", "broken.py"])
    assert [(m.path, m.name) for m in found] == [
        ("bad.py", "format"),
        ("broken.py", "command-failed"),
    ]
    assert found[0].replacement == 'x = {"a": 1}\n'


def test_ufmt_flags_a_line_the_patch_adds(tmp_path, monkeypatch):
    monkeypatch.setattr(patch_series, "REPO", tmp_path)
    path = "torch/nn/parallel/fake.py"
    for new, expected in (("x = {'a':1}", ["ufmt"]), ('x = {"a": 1}', [])):
        patch, text = fake(
            tmp_path, subject="[DDP] Add a thing", path=path, old="x = 1", new=new
        )
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(f"context\n{new}\ncontext\n")
        found = patch_series.lint_ufmt(
            tmp_path,
            path,
            patch_series.map_added_lines({patch: unidiff.PatchSet(text)}, path),
        )
        assert names(found) == expected
        if found:
            assert found[0].line == text.splitlines().index(f"+{new}") + 1
            assert found[0].description.startswith(
                f"{path}:2 is not formatted as PyTorch's UFMT linter"
            )


def test_ufmt_follows_added_lines_through_the_series_and_skips_upstream_lines(
    tmp_path, monkeypatch
):
    """Two patches to one file: the lines the first adds are checked where the second moves them."""
    monkeypatch.setattr(patch_series, "REPO", tmp_path)
    tree, path = tmp_path / "tree", "torch/nn/parallel/fake.py"
    (tree / path).parent.mkdir(parents=True)
    subprocess.run(GIT + ["init", "-q", str(tree)], check=True)
    # Upstream's own line that black would change is not the series' business.
    upstream = "import os\n\nUPSTREAM = {'kept':1}\n\n\ndef g():\n    return os\n"
    steps = [
        # 1: a black-unclean assignment, and a function without the two blank lines before it.
        upstream + "def h():\n    return {'a':1}\n",
        # 2: a clean line above, which moves what patch 1 added.
        "import os\n\nEARLY = {\"b\": 2}\nUPSTREAM = {'kept':1}\n\n\ndef g():\n    return os\n"
        "def h():\n    return {'a':1}\n",
    ]
    (tree / path).write_text(upstream)
    git(tree, "add", "-A")
    git(tree, "commit", "-qm", "base")
    for number, text in enumerate(steps, 1):
        (tree / path).write_text(text)
        git(tree, "commit", "-qam", f"step {number}")
    git(tree, "format-patch", "-q", "-o", str(tmp_path), "HEAD~2")
    patches = sorted(tmp_path.glob("*.patch"))
    added = patch_series.map_added_lines(
        {p: unidiff.PatchSet(p.read_text()) for p in patches}, path
    )
    final = steps[-1].splitlines()
    assert {n: (p.name[:4], final[n - 1]) for n, (p, _) in added.items()} == {
        3: ("0002", 'EARLY = {"b": 2}'),
        9: ("0001", "def h():"),
        10: ("0001", "    return {'a':1}"),
    }
    found = patch_series.lint_ufmt(tree, path, added)
    assert [(m.path, m.description.split(" ")[0]) for m in found] == [
        (patches[0].name, f"{path}:9"),  # black puts two blank lines before it
        (patches[0].name, f"{path}:10"),
    ]
    assert [patches[0].read_text().splitlines()[m.line - 1] for m in found] == [
        "+def h():",
        "+    return {'a':1}",
    ]
