"""Install, inspect and remove the overlay in the running interpreter's torch.

Runs inside the overlay venv (``python -m torch_overlay``), next to the torch it
series. What it installs, all generated from ``patches/``:

* the installed copies of the files the series changes and the wheel ships
  (``distributed.py``, ``_distributed_c10d.pyi``, ``reducer.hpp``), patched
  with ``git apply``; ``distributed.py`` also imports the package below, so
  that it never runs with the stock Reducer (``python -S`` skips ``.pth`` files);
* the package ``_ddp_update_process_group_overlay`` in site-packages: the
  compiled ``reducer.cpp`` and ``logger.cpp`` additions and bindings (``_C``),
  the import hook
  that loads them (``__init__.py``), the original files (``backup/``) and a
  manifest; plus a ``.pth`` file that imports the package at start-up.

Nothing in site-packages changes until everything was generated and compiled,
and a failure while writing puts the original files back.
"""

import dataclasses
import hashlib
import json
import pathlib
import shutil
import subprocess
import tempfile
from typing import Callable, Dict, List, Optional

from torch_overlay import bases, build, callers, carriage, codegen, cpp_classes, wheel
from torch_overlay.cpp_classes import AddedMember
from torch_overlay.reporting import OverlayError, progress
from torch_overlay.series import (
    find_installed_path,
    HEADER_SUFFIXES,
    read_series,
    Series,
)
from torch_overlay.wheel import sha256, Torch

PACKAGE = "_ddp_update_process_group_overlay"

# Where the series changes DDP's Python, the Reducer methods it calls are the overlay's.
# The .pth file loads them at start-up, but not under `python -S` (or wherever site is
# skipped), where DDP would call the stock Reducer's: so the patched distributed.py
# loads them itself as it is imported, and fails to import without them.
DDP_MODULE = "torch/nn/parallel/distributed.py"


def generate_extension_loader(torch_version: str) -> str:
    """Return what the overlay appends to the installed distributed.py of torch ``torch_version``."""
    stock = torch_version.split("+")[0]
    return f"""

# Added by torch_overlay: the Reducer methods that this file calls are the
# overlay's, which its start-up hook loads; load them here too, for
# interpreters that skip the start-up hooks (python -S).
try:
    import {PACKAGE}  # noqa: F401,E402
except ImportError as _overlay_missing:
    raise ImportError(
        "torch/nn/parallel/distributed.py carries the update_process_group overlay, "
        "whose extension ({PACKAGE}) cannot be imported: install the overlay again "
        "(scripts/overlay install in its repository), or restore the stock files with "
        "pip install --force-reinstall --no-deps torch=={stock}"
    ) from _overlay_missing
"""


# The overlay's own sources, whose every change may change what gets installed.
OVERLAY_SOURCE_SUFFIXES = (".py", ".cpp", ".h")


@dataclasses.dataclass
class Manifest:
    stamp: str
    torch_version: str
    files: Dict[
        str, Dict[str, str]
    ]  # installed path -> {"original": sha, "patched": sha}

    @classmethod
    def read(cls, site_packages: pathlib.Path) -> Optional["Manifest"]:
        path = site_packages / PACKAGE / "manifest.json"
        if not path.is_file():
            return None
        return cls(**json.loads(path.read_text()))

    def write(self, package_dir: pathlib.Path) -> None:
        (package_dir / "manifest.json").write_text(
            json.dumps(dataclasses.asdict(self), indent=2) + "\n"
        )


def compute_stamp(series: Series) -> str:
    h = hashlib.sha256(series.compute_digest().encode())
    for source in sorted(build.OVERLAY_DIR.iterdir()):
        if source.suffix in OVERLAY_SOURCE_SUFFIXES:
            h.update(source.name.encode() + b"\0" + source.read_bytes())
    return h.hexdigest()


def read_originals(torch: Torch, applied: List[str]) -> Dict[str, bytes]:
    """Return the wheel's own bytes of each file in ``applied``, checked against RECORD.

    Where the overlay is installed, they come from its backups.
    """
    manifest = Manifest.read(torch.site_packages)
    result = {}
    for repo_path in applied:
        installed = find_installed_path(repo_path)
        if manifest is not None and installed in manifest.files:
            data = (torch.site_packages / PACKAGE / "backup" / installed).read_bytes()
        else:
            data = (torch.site_packages / installed).read_bytes()
        torch.check_pristine(installed, data)
        result[repo_path] = data
    return result


def apply_patches(
    tree: pathlib.Path, series: Series, sources: Dict[str, bytes]
) -> Dict[str, bytes]:
    """Apply the series to copies of ``sources`` under ``tree``; returns the patched bytes."""
    if not series.applied:
        return {}
    for repo_path, data in sources.items():
        (tree / repo_path).parent.mkdir(parents=True, exist_ok=True)
        (tree / repo_path).write_bytes(wheel.unwrap_header(data))
    includes = [f"--include={p}" for p in series.applied]
    for patch in series.patches:
        result = subprocess.run(
            ["git", "apply", "--whitespace=nowarn", *includes, str(patch)],
            cwd=tree,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise OverlayError(
                f"{patch.name} does not apply to the files of the installed torch:\n{result.stderr.strip()}"
            )
    return {
        p: wheel.wrap_header_as(sources[p], (tree / p).read_bytes())
        for p in series.applied
    }


def install(
    repo: pathlib.Path,
    torch: Torch,
    base: bases.Base,
    builder: Callable[..., pathlib.Path] = build.build_extension,
    fixes_only: bool = False,
    check: Optional[Callable[..., None]] = None,
) -> None:
    """Install the overlay generated from ``base``'s series in ``repo`` into ``torch``'s site-packages.

    Args:
        repo: the repository, whose ``patches/<base>/`` the overlay is generated from.
        torch: the torch distribution to patch.
        base: the release whose series to carry; ``torch`` must be of its line.
        builder: compiles the extension; called as ``builder(include_dir, series,
            members)`` and returns the built module's path.
        fixes_only: carry only the patches that fix bugs, which the series starts
            with (through ``base.last_fix``); ``torch`` may then also be one of
            ``base.fixes_also_on``.
        check: checks that the built extension reaches every caller of what it
            changes in libtorch; called as ``check(torch, built, series, members)``.
            Default: :func:`check_built_carriage`.
    """
    check = check or check_built_carriage
    try:
        base.check_fixes(torch.version) if fixes_only else base.check(torch.version)
    except bases.UnsupportedTorch as e:
        raise OverlayError(str(e)) from e
    series = read_base_series(repo, torch, base, fixes_only)
    new_stamp = compute_stamp(series)
    manifest = Manifest.read(torch.site_packages)
    if (
        manifest is not None
        and manifest.stamp == new_stamp
        and not find_problems(torch, manifest)
    ):
        progress(
            f"already installed and up to date with patches/ ({len(series.patches)} patches)"
        )
        return
    if manifest is not None:
        progress("installed overlay is out of date with patches/: rebuilding")

    sources = read_originals(torch, series.applied)
    # What an earlier series patched and this one does not goes back to the wheel's bytes.
    newly_applied = {find_installed_path(p) for p in series.applied}
    dropped = {
        installed: (torch.site_packages / PACKAGE / "backup" / installed).read_bytes()
        for installed in (manifest.files if manifest is not None else {})
        if installed not in newly_applied
    }
    for installed, data in dropped.items():
        torch.check_pristine(installed, data)
    with tempfile.TemporaryDirectory(prefix="torch_overlay.") as tmp:
        tmp_dir = pathlib.Path(tmp)
        progress(
            f"applying {len(series.patches)} patches to {', '.join(series.applied)}"
        )
        patched = apply_patches(tmp_dir / "tree", series, sources)
        members = strip_added_members(sources, patched)
        if DDP_MODULE in patched:
            patched[DDP_MODULE] += generate_extension_loader(torch.version).encode()
        include = tmp_dir / "include"
        for repo_path, data in patched.items():
            if repo_path.endswith(HEADER_SUFFIXES):
                (include / repo_path).parent.mkdir(parents=True, exist_ok=True)
                (include / repo_path).write_bytes(data)
        # renames_source() reads both headers, patched or not.
        for header in codegen.RENAMED_HEADERS:
            if not (include / header).is_file():
                (include / header).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(
                    torch.site_packages / find_installed_path(header),
                    include / header,
                )
        built = builder(include, series, members)
        check(torch, built, series, members)

        package_new = torch.site_packages / (PACKAGE + ".new")
        shutil.rmtree(package_new, ignore_errors=True)
        package_new.mkdir()
        shutil.copy2(build.OVERLAY_DIR / "site_hook.py", package_new / "__init__.py")
        shutil.copy2(built, package_new / built.name)
        files = {}
        for repo_path, data in sources.items():
            installed = find_installed_path(repo_path)
            backup = package_new / "backup" / installed
            backup.parent.mkdir(parents=True, exist_ok=True)
            backup.write_bytes(data)
            files[installed] = {
                "original": sha256(data),
                "patched": sha256(patched[repo_path]),
            }
        Manifest(new_stamp, torch.version, files).write(package_new)

        progress("writing the patched files into " + str(torch.site_packages))
        try:
            for installed, data in dropped.items():
                write_atomically(torch.site_packages / installed, data)
            for repo_path, data in patched.items():
                write_atomically(
                    torch.site_packages / find_installed_path(repo_path), data
                )
            shutil.rmtree(torch.site_packages / PACKAGE, ignore_errors=True)
            package_new.rename(torch.site_packages / PACKAGE)
            (torch.site_packages / (PACKAGE + ".pth")).write_text(f"import {PACKAGE}\n")
        except BaseException:
            for repo_path, data in sources.items():
                write_atomically(
                    torch.site_packages / find_installed_path(repo_path), data
                )
            for installed, data in dropped.items():
                write_atomically(torch.site_packages / installed, data)
            shutil.rmtree(package_new, ignore_errors=True)
            raise
    what = (
        f"the fixes of the {base.name} series"
        if fixes_only
        else f"the {base.name} series"
    )
    progress(
        f"installed: torch {torch.version} now carries {what} ({len(series.patches)} patches)"
    )


def read_base_series(
    repo: pathlib.Path, torch: Torch, base: bases.Base, fixes_only: bool
) -> Series:
    """Read ``base``'s series in ``repo``, or its fixes alone."""
    try:
        count = len(base.fix_patches(repo)) if fixes_only else None
    except bases.UnsupportedTorch as e:
        raise OverlayError(str(e)) from e
    return read_series(base.patches(repo), torch.site_packages, count=count)


def strip_added_members(
    sources: Dict[str, bytes], patched: Dict[str, bytes]
) -> List[AddedMember]:
    """Leave the data members that the series adds to classes out of ``patched``'s headers.

    Returns them, for the extension's shims: a header installed with them would
    change the layout of a class that libtorch was compiled with.
    """
    members: List[AddedMember] = []
    for repo_path in list(patched):
        if not repo_path.endswith(HEADER_SUFFIXES):
            continue
        stock = sources[repo_path].decode()
        text = patched[repo_path].decode()
        try:
            added = cpp_classes.find_added_members(repo_path, stock, text)
        except cpp_classes.ClassesError as e:
            raise OverlayError(str(e)) from e
        if added:
            patched[repo_path] = cpp_classes.strip_members(text, added).encode()
            members += added
    return members


def check_built_carriage(
    torch: Torch, built: pathlib.Path, series: Series, members: List[AddedMember]
) -> None:
    """Check that the extension at ``built`` reaches every caller of what it changes in libtorch."""
    lib_dir = torch.site_packages / "torch" / "lib"
    headers = torch.site_packages / "torch" / "include" / build.C10D_HEADERS
    try:
        targets = build.find_prologue_targets(headers, lib_dir, series)
        carriage.check_carriage(
            torch, carriage.decide_carriage(built, lib_dir, series, members, targets)
        )
    except callers.CallersError as e:
        raise OverlayError(str(e)) from e


def write_atomically(path: pathlib.Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".overlay-tmp")
    tmp.write_bytes(data)
    shutil.copymode(path, tmp)
    tmp.replace(path)


def find_problems(torch: Torch, manifest: Manifest) -> List[str]:
    """Return what differs between the installed overlay and its manifest."""
    found = []
    package = torch.site_packages / PACKAGE
    if not list(package.glob("_C*.so")):
        found.append(f"the extension is missing from {package}")
    if not (torch.site_packages / (PACKAGE + ".pth")).is_file():
        found.append(f"{PACKAGE}.pth is missing, so the extension would not be loaded")
    for installed, shas in manifest.files.items():
        current = sha256((torch.site_packages / installed).read_bytes())
        if current != shas["patched"]:
            found.append(f"{installed} was changed after the overlay patched it")
    return found


def print_status(
    repo: pathlib.Path, torch: Torch, base: bases.Base, fixes_only: bool = False
) -> int:
    """Print what is installed; 0 when it matches patches/, 1 when not installed, 2 when stale."""
    print(f"torch {torch.version} in {torch.site_packages}")
    manifest = Manifest.read(torch.site_packages)
    if manifest is None:
        print("overlay: not installed")
        return 1
    found = find_problems(torch, manifest)
    series = read_base_series(repo, torch, base, fixes_only)
    if manifest.stamp != compute_stamp(series):
        found.append("patches/ or the overlay sources changed since it was installed")
    for installed in manifest.files:
        print(f"  patched: {installed}")
    if found:
        print("overlay: installed, out of date")
        for problem in found:
            print(f"  {problem}")
        print("  run scripts/overlay install to rebuild it")
        return 2
    print(f"overlay: installed, matches patches/ ({len(series.patches)} patches)")
    return 0


def uninstall(torch: Torch) -> None:
    manifest = Manifest.read(torch.site_packages)
    package = torch.site_packages / PACKAGE
    if manifest is None:
        progress("not installed; nothing to do")
        return
    for installed in manifest.files:
        data = (package / "backup" / installed).read_bytes()
        torch.check_pristine(installed, data)
        write_atomically(torch.site_packages / installed, data)
        progress(f"restored {installed}")
    (torch.site_packages / (PACKAGE + ".pth")).unlink(missing_ok=True)
    shutil.rmtree(package)
    progress(f"uninstalled: torch {torch.version} is as the wheel installed it")
