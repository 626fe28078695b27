"""Read what the overlay's and the scripts' tests (test/torch_overlay, test/scripts) share.

As torch.testing serves PyTorch's tests, this module serves the tests of the tools: both
suites run in the venv of one base, on its series, and stand in for its wheel's files.
"""

import pathlib
from typing import Dict

import pytest

from torch_overlay import bases, install, series
from torch_overlay.wheel import Torch

# The base whose venv and series the tool tests run on (scripts/test --base v2.1.2).
BASE = bases.get(bases.TOOL_TESTS_BASE)


def read_wheel_originals(repo: pathlib.Path, tests: str) -> Dict[str, bytes]:
    """Return the wheel's own bytes of the files that ``repo``'s BASE series patches, by installed path.

    ``tests`` is the folder of the tests that ask; if the venv's torch is not BASE's, raise a
    pytest.UsageError that says how to run them.
    """
    torch = Torch.find()
    if bases.parse(torch.version) != BASE.release:
        raise pytest.UsageError(
            f"{tests} runs in the {BASE.name} venv, with torch {BASE.torch}; this is torch "
            f"{torch.version}: scripts/test --base {BASE.name} {tests}"
        )
    applied = series.read_series(BASE.patches(repo), torch.site_packages).applied
    return {
        series.find_installed_path(p): data
        for p, data in install.read_originals(torch, applied).items()
    }
