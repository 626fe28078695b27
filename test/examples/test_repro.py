"""examples/repro/: each reproduction exits 1 on the stock wheel and 0 with the series.

Which of the two the venv holds decides what is expected: `scripts/test` runs these with
the overlay, `scripts/test --stock` without it.
"""

import inspect
import pathlib
import subprocess
import sys

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from torch_overlay import bases

REPO = pathlib.Path(__file__).resolve().parents[2]
REPRO = REPO / "examples" / "repro"
SCRIPTS = (
    "inflight_allreduce.py",
    "finalize_backward_failure.py",
    "bucket_assignment.py",
    "reconfigure_in_place.py",
)


def overlay_installed() -> bool:
    base = next(
        b for b in bases.BASES.values() if b.release == bases.parse(torch.__version__)
    )
    status = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch_overlay",
            "status",
            "--repo",
            str(REPO),
            "--base",
            base.name,
        ],
        capture_output=True,
        text=True,
    )
    assert status.returncode in (0, 1), f"the overlay is out of date:\n{status.stdout}"
    return status.returncode == 0


@pytest.mark.parametrize("script", SCRIPTS)
def test_reproduction(script):
    if script == "reconfigure_in_place.py" and not hasattr(
        torch.distributed, "_reconfigure"
    ):
        pytest.skip(
            f"torch {torch.__version__} cannot reconfigure a group in place (2.14 can)"
        )
    constructor = inspect.signature(DistributedDataParallel.__init__).parameters
    if script == "finalize_backward_failure.py" and "bucket_cap_mb_list" not in (
        constructor
    ):
        pytest.skip(
            f"torch {torch.__version__}'s DistributedDataParallel has no "
            "bucket_cap_mb_list, which the script needs for its two buckets"
        )
    series = overlay_installed()
    if not series and not hasattr(DistributedDataParallel, "_update_process_group"):
        pytest.skip(
            f"stock torch {torch.__version__} has no _update_process_group to reproduce a bug of"
        )
    result = subprocess.run(
        [sys.executable, str(REPRO / script)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if series:
        assert result.returncode == 0, result.stdout + result.stderr[-3000:]
        assert "ok: the gradients are right" in result.stdout
    else:
        assert result.returncode == 1, result.stdout + result.stderr[-3000:]
        assert (
            "WRONG: the gradients are not the average over the ranks" in result.stdout
        )


@pytest.mark.parametrize("script", SCRIPTS + ("common.py",))
def test_issue_texts_paste_the_scripts_as_they_are(script):
    # docs/upstream-issues.md pastes each script whole, for the issue to stand alone.
    text = (REPO / "docs" / "upstream-issues.md").read_text()
    assert f"```python\n{(REPRO / script).read_text()}```" in text
