"""Fixtures of the overlay's tests: a stand-in site-packages with the wheel's real base files.

The stand-in holds the wheel's real base files (taken from the venv's torch, or
from the overlay's backups when it is installed there) and a RECORD for them;
only the compiler is replaced, so these tests run in seconds. That test/
agrees with the series is the patch series linter's job (test_lint.py).
"""

import shutil

import pytest

from overlay_fixtures import BASE, ORIGINALS, PATCHES, sha
from torch_overlay.wheel import Torch


@pytest.fixture
def site(tmp_path):
    site = tmp_path / "site-packages"
    for installed, data in ORIGINALS.items():
        (site / installed).parent.mkdir(parents=True, exist_ok=True)
        (site / installed).write_bytes(data)
    return site


@pytest.fixture
def torch_dist(site):
    return Torch(
        "2.1.2", site, {installed: sha(data) for installed, data in ORIGINALS.items()}
    )


@pytest.fixture
def repo(tmp_path):
    """A copy of the repository's patches, to change without touching the real ones."""
    copy = tmp_path / "repo"
    shutil.copytree(PATCHES, BASE.patches(copy))
    return copy
