"""The bases: which torch each series takes, and its fixes."""

import dataclasses

import pytest

from overlay_fixtures import REPO
from torch_overlay import bases, commits


@pytest.mark.parametrize(
    "version, message",
    [
        ("2.14.1", None),
        ("2.11.0+cu130", None),
        ("2.13.0", "apply to torch 2.14.x, 2.11.x, not to torch 2.13.0"),
    ],
)
def test_the_fixes_alone_go_onto_more_releases(version, message):
    upstream = bases.get("v2.14.1")
    if message is None:
        upstream.check_fixes(version)
    else:
        with pytest.raises(bases.UnsupportedTorch, match=message):
            upstream.check_fixes(version)
    with pytest.raises(bases.UnsupportedTorch, match="marks no patches as fixes"):
        bases.get("v2.1.2").check_fixes("2.1.2")


def test_the_last_fix_is_named_by_a_subject_of_the_series():
    upstream = bases.get("v2.14.1")
    assert commits.read_subject(upstream.fix_patches(REPO)[-1]) == upstream.last_fix
    renamed = dataclasses.replace(upstream, last_fix=upstream.last_fix + " again")
    with pytest.raises(
        bases.UnsupportedTorch, match="last fix: no patch in .* the closest is"
    ):
        renamed.fix_patches(REPO)


@pytest.mark.parametrize(
    "base, version, message",
    [
        (
            "v2.1.2",
            "2.2.0",
            "has DistributedDataParallel._update_process_group upstream.*--base v2.14.1",
        ),
        (
            "v2.1.2",
            "2.13.0",
            "has DistributedDataParallel._update_process_group upstream",
        ),
        ("v2.1.2", "2.14.0", "that is the base v2.14.1: pass --base v2.14.1"),
        ("v2.1.2", "2.0.1", "needs torch 2.1.x"),
        ("v2.14.1", "2.1.2", "needs torch 2.14.x; that is the base v2.1.2"),
        ("v2.14.1", "2.13.0", "needs torch 2.14.x; install torch==2.14.1"),
        ("v2.1.2", "nonsense", "cannot read a torch version"),
    ],
)
def test_unsupported_torch_versions(base, version, message):
    with pytest.raises(bases.UnsupportedTorch, match=message):
        bases.get(base).check(version)


@pytest.mark.parametrize(
    "base, version",
    [
        ("v2.1.2", "2.1.0"),
        ("v2.1.2", "2.1.2"),
        ("v2.1.2", "2.1.2+cpu"),
        ("v2.14.1", "2.14.1+cu130"),
    ],
)
def test_supported_torch_versions(base, version):
    bases.get(base).check(version)


def test_unknown_base():
    with pytest.raises(
        bases.UnsupportedTorch,
        match="no series for the base 'v9'; the bases are v2.1.2, v2.14.1",
    ):
        bases.get("v9")


def test_each_base_has_a_venv_named_after_it():
    # No .venv that stands for whichever base is the default.
    assert {name: base.venv(REPO) for name, base in bases.BASES.items()} == {
        "v2.1.2": REPO / ".venv-v2.1.2",
        "v2.14.1": REPO / ".venv-v2.14.1",
    }


# Installing into a stand-in site-packages
