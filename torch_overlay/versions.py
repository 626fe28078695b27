"""Which torch releases the overlay serves. Plain Python: the scripts use it before a venv exists."""

import re
from typing import Tuple

SUPPORTED = (2, 1)
UPSTREAM_SINCE = (2, 2)


class UnsupportedTorch(Exception):
    """The installed torch is not one the overlay can patch; the message says what to do."""


def parse(version: str) -> Tuple[int, int]:
    match = re.match(r"^(\d+)\.(\d+)", version)
    if not match:
        raise UnsupportedTorch(f"cannot read a torch version from {version!r}")
    return int(match.group(1)), int(match.group(2))


def check(version: str) -> None:
    """Raise UnsupportedTorch unless ``version`` is a 2.1.x release."""
    major_minor = parse(version)
    if major_minor >= UPSTREAM_SINCE:
        raise UnsupportedTorch(
            f"torch {version} already has DistributedDataParallel._update_process_group "
            "upstream (since 2.2), so there is nothing to overlay; use it directly. "
            "The overlay is for torch 2.1.x."
        )
    if major_minor != SUPPORTED:
        raise UnsupportedTorch(
            f"torch {version} is not supported: the patch series is against v2.1.2, "
            "so the overlay needs torch 2.1.x (pip install torch==2.1.2)."
        )
