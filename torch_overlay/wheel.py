"""The installed torch wheel: where it is, its version, and the files its RECORD lists."""

import base64
import dataclasses
import hashlib
import importlib.metadata
import pathlib
import sys
from typing import Dict

from torch_overlay.reporting import OverlayError


def sha256(data: bytes) -> str:
    """Return the hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


# Since 2.9, torch's setup.py wraps every header it installs in this guard; the
# series' hunks are made against the sources, which have none, and a hunk at
# the top of a header (an #include) only applies to the text inside it.
_GUARD_CONDITION = b"!defined(TORCH_STABLE_ONLY) && !defined(TORCH_TARGET_VERSION)"
_GUARD_OPEN = b"#if " + _GUARD_CONDITION + b"\n"
_GUARD_CLOSE = (
    b'\n#else\n#error "This file should not be included when either '
    b'TORCH_STABLE_ONLY or TORCH_TARGET_VERSION is defined."\n#endif  // '
    + _GUARD_CONDITION
    + b"\n"
)


def unwrap_header(data: bytes) -> bytes:
    """Return ``data``, an installed header, as in the sources: without the guard."""
    if data.startswith(_GUARD_OPEN) and data.endswith(_GUARD_CLOSE):
        return data[len(_GUARD_OPEN) : -len(_GUARD_CLOSE)]
    return data


def wrap_header_as(installed: bytes, patched: bytes) -> bytes:
    """Return ``patched``, a header as in the sources, with the guard ``installed`` has."""
    if installed == unwrap_header(installed):
        return patched
    return _GUARD_OPEN + patched + _GUARD_CLOSE


@dataclasses.dataclass
class Torch:
    """The torch distribution in this interpreter, located without importing it."""

    version: str
    site_packages: pathlib.Path
    record: Dict[str, str]  # installed path -> sha256 hex, from the wheel's RECORD

    @classmethod
    def find(cls) -> "Torch":
        try:
            dist = importlib.metadata.distribution("torch")
        except importlib.metadata.PackageNotFoundError as e:
            raise OverlayError(f"torch is not installed in {sys.prefix}") from e
        return cls._of(dist)

    @classmethod
    def at(cls, site_packages: pathlib.Path) -> "Torch":
        """Return the torch distribution installed in another environment's ``site_packages``."""
        found = [
            d
            for d in importlib.metadata.distributions(path=[str(site_packages)])
            if d.metadata["Name"] == "torch"
        ]
        if not found:
            raise OverlayError(f"torch is not installed in {site_packages}")
        return cls._of(found[0])

    @classmethod
    def _of(cls, dist: importlib.metadata.Distribution) -> "Torch":
        record = {}
        for f in dist.files or []:
            if f.hash is not None and f.hash.mode == "sha256":
                # RECORD stores urlsafe base64; keep hex to compare with hashlib.
                digest = base64.urlsafe_b64decode(
                    f.hash.value + "=" * (-len(f.hash.value) % 4)
                )
                record[str(f)] = digest.hex()
        return cls(dist.version, pathlib.Path(str(dist.locate_file(""))), record)

    def check_pristine(self, installed: str, data: bytes) -> None:
        expected = self.record.get(installed)
        if expected is None:
            raise OverlayError(f"{installed} is not listed in the torch wheel's RECORD")
        if sha256(data) != expected:
            raise OverlayError(
                f"{self.site_packages / installed} differs from the file the torch {self.version} "
                "wheel installed, and the overlay did not change it. Reinstall torch "
                f"(pip install --force-reinstall --no-deps torch=={self.version}) and run "
                "the overlay again."
            )
