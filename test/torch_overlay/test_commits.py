"""Naming a series' commits by subject."""

import pytest

from overlay_fixtures import REPO
from torch_overlay import bases, commits

FOLDED = """\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: A <a@example.com>
Date: Sat, 5 Dec 2026 02:22:00 +0000
Subject: [PATCH 02/27] [c10d] Reducer::reset_state(): abandon the collectives
 of a pass that failed in finalize_backward()

Why.
---
"""


def test_the_subject_is_unfolded_and_unnumbered(tmp_path):
    (tmp_path / "0002-c10d.patch").write_text(FOLDED)
    assert commits.read_subject(tmp_path / "0002-c10d.patch") == (
        "[c10d] Reducer::reset_state(): abandon the collectives of a pass that "
        "failed in finalize_backward()"
    )


def test_a_patch_is_found_by_its_subject_whatever_its_number(tmp_path):
    (tmp_path / "0001-a.patch").write_text(FOLDED.replace("02/27", "01/27"))
    (tmp_path / "0007-b.patch").write_text(
        FOLDED.replace("abandon the collectives\n of", "keep the collectives\n of")
    )
    subject = commits.read_subject(tmp_path / "0007-b.patch")
    assert commits.find_patch(tmp_path, subject) == tmp_path / "0007-b.patch"
    assert commits.list_patches_through(tmp_path, subject) == [
        tmp_path / "0001-a.patch",
        tmp_path / "0007-b.patch",
    ]
    with pytest.raises(commits.UnknownCommit, match="the closest is"):
        commits.find_patch(tmp_path, subject.replace("keep", "kept"))


def test_a_file_without_a_subject_is_refused(tmp_path):
    (tmp_path / "0001-x.patch").write_text("diff --git a/x b/x\n")
    with pytest.raises(commits.UnknownCommit, match="not a git format-patch file"):
        commits.read_subject(tmp_path / "0001-x.patch")


@pytest.mark.parametrize("base", sorted(bases.BASES))
def test_every_subject_of_a_series_is_unique(base):
    subjects = commits.list_subjects(bases.get(base).patches(REPO))
    assert len(subjects) == len(set(subjects))
