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
        """The torch distribution installed in another environment's ``site_packages``."""
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
