"""Run stock torch in the overlay venv: the wheel's own Python files, and none of the overlay.

The overlay patches some of the wheel's Python files in place and keeps the originals in
``_ddp_update_process_group_overlay/backup/``, with their sha256 in its manifest; a ``.pth``
file loads its extension at start-up. A process started with ``python -S`` skips that file (and
site-packages with it); :func:`use_stock_files` then puts site-packages back on ``sys.path`` and
makes every patched module load from its original, after checking that it is the original.
Nothing of the overlay is then imported: DDP is stock DDP, on the wheel's own Reducer bindings.

``python -S -m benchmarks.recovery.stock_torch MODULE ARGS...`` runs MODULE as ``__main__`` so,
with ARGS: the driver starts its stock workers that way (:func:`command` and this module's name).
"""

import argparse
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import pathlib
import runpy
import sys
import sysconfig
from typing import Dict, List

PACKAGE = "_ddp_update_process_group_overlay"
# Where the driver, which runs with site, says site-packages is.
SITE_PACKAGES_ENV = "STOCK_TORCH_SITE_PACKAGES"


class _OriginalSource(importlib.machinery.SourceFileLoader):
    """Loads the original source of a module under its installed file's name: Dynamo chooses
    how to trace a function by its file's name, and traces torch's own files as torch.
    """

    def __init__(self, name: str, installed: str, original: str):
        super().__init__(name, installed)
        self.original = original

    def get_data(self, path):
        if path == self.path:
            return pathlib.Path(self.original).read_bytes()
        return super().get_data(path)

    def path_stats(self, path):
        # No bytecode cache: the installed file's cache is that of the patched file.
        raise OSError(f"{path}: compiled from {self.original}")


class _OriginalFiles(importlib.abc.MetaPathFinder):
    def __init__(self, site_packages: pathlib.Path, originals: Dict[str, str]):
        self.site_packages = site_packages
        self.originals = originals  # module name -> the original file, by its path under site-packages

    def find_spec(self, name, path=None, target=None):
        if name not in self.originals:
            return None
        relative = self.originals[name]
        installed = str(self.site_packages / relative)
        original = str(self.site_packages / PACKAGE / "backup" / relative)
        return importlib.util.spec_from_file_location(
            name, installed, loader=_OriginalSource(name, installed, original)
        )


def use_stock_files() -> None:
    """Make this interpreter, started with ``python -S``, import the wheel's own files."""
    if not sys.flags.no_site:
        raise RuntimeError(
            "stock torch needs python -S: the overlay's .pth file has already run"
        )
    if SITE_PACKAGES_ENV not in os.environ:
        raise RuntimeError(
            f"python -S: set {SITE_PACKAGES_ENV} to the overlay venv's site-packages (make_command() does)"
        )
    site_packages = pathlib.Path(os.environ[SITE_PACKAGES_ENV])
    # Not the project's imports (the driver puts the repository on PYTHONPATH): torch's, from
    # the site-packages that -S left out, without running its .pth files.
    sys.path.append(str(site_packages))
    manifest = json.loads((site_packages / PACKAGE / "manifest.json").read_text())
    originals = {}
    for relative, digests in manifest["files"].items():
        if not relative.endswith(".py"):
            continue
        backup = site_packages / PACKAGE / "backup" / relative
        if hashlib.sha256(backup.read_bytes()).hexdigest() != digests["original"]:
            raise RuntimeError(
                f"{backup} is not the wheel's {relative}: install the overlay again"
            )
        originals[relative[: -len(".py")].replace("/", ".")] = relative
    sys.meta_path.insert(0, _OriginalFiles(site_packages, originals))


def make_command(env: Dict[str, str]) -> List[str]:
    """Return the start of the command line of a stock process; set what it needs in ``env``."""
    env[SITE_PACKAGES_ENV] = sysconfig.get_paths()["purelib"]
    return [sys.executable, "-S"]


def run_module_on_stock_files(argv: List[str]) -> None:
    """Run module ``argv[0]`` as ``__main__`` on the wheel's own files, with ``argv`` as its arguments."""
    use_stock_files()
    sys.argv = list(argv)
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


def main() -> None:
    """Run the module that the command line names on the wheel's own files."""
    parser = argparse.ArgumentParser(
        prog="python -S -m benchmarks.recovery.stock_torch",
        description=f"Run MODULE as __main__ on the wheel's own files; {SITE_PACKAGES_ENV} "
        "names the venv's site-packages.",
    )
    parser.add_argument("module", help="for example benchmarks.recovery.worker_steady")
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="MODULE's")
    args = parser.parse_args()
    run_module_on_stock_files([args.module, *args.arguments])


if __name__ == "__main__":
    main()
