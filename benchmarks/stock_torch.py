"""Run stock torch in the overlay venv: the wheel's own Python files, and none of the overlay.

The overlay patches some of the wheel's Python files in place and keeps the originals in
``_ddp_update_process_group_overlay/backup/``, with their sha256 in its manifest; a ``.pth``
file loads its extension at start-up. A process started with ``python -S`` skips that file (and
site-packages with it); :func:`use_stock_files` then puts site-packages back on ``sys.path`` and
makes every patched module load from its original, after checking that it is the original.
Nothing of the overlay is then imported: DDP is stock DDP, on the wheel's own Reducer bindings.
"""

import hashlib
import importlib.abc
import importlib.util
import json
import os
import pathlib
import sys
import sysconfig
from typing import Dict, List

PACKAGE = "_ddp_update_process_group_overlay"
# Where the driver, which runs with site, says site-packages is.
SITE_PACKAGES_ENV = "STOCK_TORCH_SITE_PACKAGES"


class _OriginalFiles(importlib.abc.MetaPathFinder):
    def __init__(self, originals):
        self.originals = originals  # module name -> path of the original file

    def find_spec(self, name, path=None, target=None):
        if name in self.originals:
            return importlib.util.spec_from_file_location(name, self.originals[name])
        return None


def use_stock_files() -> None:
    """Makes this interpreter, started with ``python -S``, import the wheel's own files."""
    if not sys.flags.no_site:
        raise RuntimeError("stock torch needs python -S: the overlay's .pth file has already run")
    if SITE_PACKAGES_ENV not in os.environ:
        raise RuntimeError(f"python -S: set {SITE_PACKAGES_ENV} to the overlay venv's site-packages (command() does)")
    site_packages = pathlib.Path(os.environ[SITE_PACKAGES_ENV])
    sys.path.append(str(site_packages))
    manifest = json.loads((site_packages / PACKAGE / "manifest.json").read_text())
    originals = {}
    for relative, digests in manifest["files"].items():
        if not relative.endswith(".py"):
            continue
        backup = site_packages / PACKAGE / "backup" / relative
        if hashlib.sha256(backup.read_bytes()).hexdigest() != digests["original"]:
            raise RuntimeError(f"{backup} is not the wheel's {relative}: install the overlay again")
        originals[relative[: -len(".py")].replace("/", ".")] = str(backup)
    sys.meta_path.insert(0, _OriginalFiles(originals))


def command(env: Dict[str, str]) -> List[str]:
    """The start of the command line of a stock process; sets what it needs in ``env``."""
    env[SITE_PACKAGES_ENV] = sysconfig.get_paths()["purelib"]
    return [sys.executable, "-S"]
