"""scripts/mutants' own logic: where a mutant's replacements land, and that every mutant fits the series."""

import re

import pytest

from conftest import load_script, REPO
from torch_overlay import bases, commits

mutants = load_script("mutants")


def header(subject):
    return f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] {subject}\n\n---\n"


FIRST = (
    header("First")
    + """\
@@ -1,2 +1,3 @@
 a
+    x = 1
 b
"""
)
LATER = (
    header("Later")
    + """\
@@ -1,3 +1,4 @@
 a
     x = 1
+    y = 2
 b
"""
)


def test_replacement_reaches_later_patches_that_show_the_line(tmp_path):
    (tmp_path / "0001-first.patch").write_text(FIRST)
    (tmp_path / "0002-later.patch").write_text(LATER)
    mutants.mutate(
        tmp_path,
        {"name": "m", "patch": "First", "replace": [["    x = 1", "    x = 0"]]},
    )
    assert "+    x = 0\n" in (tmp_path / "0001-first.patch").read_text()
    assert "\n     x = 0\n+    y = 2\n" in (tmp_path / "0002-later.patch").read_text()


def test_the_same_line_in_another_file_is_left_alone(tmp_path):
    first = (
        header("First")
        + "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n"
        + FIRST.split("---\n", 1)[1]
    )
    later = header("Later") + (
        "diff --git a/other.py b/other.py\n--- a/other.py\n+++ b/other.py\n@@ -1,1 +1,2 @@\n"
        "     x = 1\n+    z = 3\n"
    )
    (tmp_path / "0001-first.patch").write_text(first)
    (tmp_path / "0002-later.patch").write_text(later)
    mutants.mutate(
        tmp_path,
        {"name": "m", "patch": "First", "replace": [["    x = 1", "    x = 0"]]},
    )
    assert (tmp_path / "0002-later.patch").read_text() == later


def test_replacement_of_a_line_the_patch_does_not_add_is_refused(tmp_path):
    (tmp_path / "0001-first.patch").write_text(FIRST)
    with pytest.raises(SystemExit):
        mutants.mutate(
            tmp_path, {"name": "m", "patch": "First", "replace": [["a", "z"]]}
        )


def test_a_subject_that_no_patch_has_is_refused_naming_the_closest(tmp_path, capsys):
    (tmp_path / "0001-first.patch").write_text(FIRST)
    with pytest.raises(SystemExit):
        mutants.mutate(
            tmp_path,
            {"name": "m", "patch": "Firts", "replace": [["    x = 1", "    x = 0"]]},
        )
    err = capsys.readouterr().err
    assert (
        "mutant m: no patch in" in err
        and "has the subject 'Firts'; the closest is 'First'" in err
    )


@pytest.mark.parametrize(
    "base, mutant",
    [
        (base, m)
        for base in bases.BASES.values()
        for m in mutants.load(mutants.MUTANTS / f"{base.name}.toml")
    ],
    ids=lambda x: x.name if isinstance(x, bases.Base) else x["name"],
)
def test_every_mutant_fits_the_series(base, mutant):
    assert ("kills" in mutant) != (
        "survives" in mutant
    ), "a mutant says either what kills it or why it survives"
    assert ("survives" in mutant) == (
        "runs" in mutant
    ), "a survivor says which tests exercise it"
    assert (
        "needs_gpu" not in mutant or "kills" in mutant
    ), "a mutant that needs a GPU names the CUDA case that kills it"
    patch = commits.find_patch(base.patches(REPO), mutant["patch"])
    added = patch.read_text().split("\n")
    for old, _ in mutant["replace"]:
        assert (
            added.count("+" + old) == 1
        ), f"{patch.name} does not add {old!r} exactly once"
    # A later patch that removes the line would take the mutant away before the tests run.
    # One that adds the same line again to the same file makes the later patches' context
    # ambiguous: the mutant would reach both lines there, and the series would no longer apply.
    path = mutants.find_file_of_lines(added)[added.index("+" + mutant["replace"][0][0])]
    for other in commits.list_patches(base.patches(REPO)):
        lines = other.read_text().split("\n")
        in_file = [
            line
            for line, p in zip(lines, mutants.find_file_of_lines(lines))
            if p == path
        ]
        for old, _ in mutant["replace"]:
            if other.name > patch.name:
                assert (
                    "-" + old not in in_file
                ), f"{other.name} removes {old!r}, and the mutant with it"
            if other != patch:
                assert (
                    "+" + old not in in_file
                ), f"{other.name} adds {old!r} to {path} too"


def test_a_mutant_that_needs_a_gpu_runs_only_with_one():
    mutant = {
        "name": "m",
        "kills": "test_x",
        "needs_gpu": "DDP's mixed precision casts on a CUDA stream",
    }
    assert (
        mutants.explain_not_run(mutant, has_gpu=False)
        == "needs a GPU: DDP's mixed precision casts on a CUDA stream"
    )
    assert mutants.explain_not_run(mutant, has_gpu=True) == ""
    assert (
        mutants.explain_not_run({"name": "m", "kills": "test_x"}, has_gpu=False) == ""
    )


def test_ci_runs_only_known_mutants():
    # .ci/run names the mutants of the fixes; a name that the file lost would stop CI.
    names = (
        re.search(r'FIX_MUTANTS="([^"]+)"', (REPO / ".ci" / "run").read_text())
        .group(1)
        .split()
    )
    known = {m["name"] for m in mutants.load(mutants.MUTANTS / "v2.14.1.toml")}
    assert names and sorted(set(names) - known) == []


def test_contributing_states_the_mutant_counts():
    text = " ".join((REPO / "docs" / "contributing.md").read_text().split())
    counts = {
        name: len(mutants.load(mutants.MUTANTS / f"{name}.toml"))
        for name in bases.BASES
    }
    assert f"The v2.1.2 file has {counts['v2.1.2']} mutants" in text
    assert f"the v2.14.1 file {counts['v2.14.1']}," in text
