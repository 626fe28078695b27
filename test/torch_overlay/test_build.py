"""torch_overlay.build: a source that did not change is not written again, so that ninja
builds nothing."""

import os

from torch_overlay import build


def test_write_if_changed_leaves_an_equal_file_alone(tmp_path):
    path = tmp_path / "overlay_renames.h"
    build.write_if_changed(path, "#define a b\n")
    os.utime(path, (0, 0))
    build.write_if_changed(path, "#define a b\n")
    assert path.stat().st_mtime == 0
    build.write_if_changed(path, "#define a c\n")
    assert path.read_text() == "#define a c\n"
    assert path.stat().st_mtime > 0


def test_sync_tree_makes_the_target_hold_the_source_and_touches_only_what_differs(
    tmp_path,
):
    source, target = tmp_path / "source", tmp_path / "target"
    (source / "c10d").mkdir(parents=True)
    (source / "same.h").write_text("same\n")
    (source / "c10d" / "new.cpp").write_text("new\n")
    target.mkdir()
    (target / "same.h").write_text("same\n")
    (target / "stale.cpp").write_text("stale\n")
    os.utime(target / "same.h", (0, 0))
    build.sync_tree(source, target)
    files = sorted(
        p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()
    )
    assert files == ["c10d/new.cpp", "same.h"]
    assert (target / "same.h").stat().st_mtime == 0
    assert (target / "c10d" / "new.cpp").read_text() == "new\n"
