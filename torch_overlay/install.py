"""Install, inspect and remove the overlay in the running interpreter's torch.

Runs inside the overlay venv (``python -m torch_overlay``), next to the torch it
patches. What it installs, all generated from ``patches/``:

* the installed copies of the files the series changes and the wheel ships
  (``distributed.py``, ``_distributed_c10d.pyi``, ``reducer.hpp``), patched
  with ``git apply``;
* the package ``_ddp_update_process_group_overlay`` in site-packages: the
  compiled ``reducer.cpp`` and ``logger.cpp`` additions and bindings (``_C``),
  the import hook
  that loads them (``__init__.py``), the original files (``backup/``) and a
  manifest; plus a ``.pth`` file that imports the package at start-up.

Nothing in site-packages changes until everything was generated and compiled,
and a failure while writing puts the original files back.
"""

import base64
import dataclasses
import hashlib
import importlib.metadata
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from typing import Callable, Dict, List, Optional

from torch_overlay import series as series_mod, versions

PACKAGE = "_ddp_update_process_group_overlay"
OVERLAY_DIR = pathlib.Path(__file__).resolve().parent
# Overlay sources that change what gets installed, besides the patches.
OVERLAY_SOURCES = ("bindings.cpp", "reducer_prelude.h", "site_hook.py", "install.py", "series.py")


class OverlayError(Exception):
    """The overlay cannot be installed or removed; the message says why and what to do."""


def progress(message: str) -> None:
    print(f"[overlay] {message}", flush=True)


def sha256(data: bytes) -> str:
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
        record = {}
        for f in dist.files or []:
            if f.hash is not None and f.hash.mode == "sha256":
                # RECORD stores urlsafe base64; keep hex to compare with hashlib.
                digest = base64.urlsafe_b64decode(f.hash.value + "=" * (-len(f.hash.value) % 4))
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


@dataclasses.dataclass
class Manifest:
    stamp: str
    torch_version: str
    files: Dict[str, Dict[str, str]]  # installed path -> {"original": sha, "patched": sha}

    @classmethod
    def read(cls, site_packages: pathlib.Path) -> Optional["Manifest"]:
        path = site_packages / PACKAGE / "manifest.json"
        if not path.is_file():
            return None
        return cls(**json.loads(path.read_text()))

    def write(self, package_dir: pathlib.Path) -> None:
        (package_dir / "manifest.json").write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")


def stamp(patches: series_mod.Series) -> str:
    h = hashlib.sha256(patches.digest().encode())
    for name in OVERLAY_SOURCES:
        h.update((OVERLAY_DIR / name).read_bytes())
    return h.hexdigest()


def originals(torch: Torch, manifest: Optional[Manifest], applied: List[str]) -> Dict[str, bytes]:
    """The wheel's own bytes for each file the series patches, checked against RECORD."""
    result = {}
    for repo_path in applied:
        installed = series_mod.installed_path(repo_path)
        if manifest is not None and installed in manifest.files:
            data = (torch.site_packages / PACKAGE / "backup" / installed).read_bytes()
        else:
            data = (torch.site_packages / installed).read_bytes()
        torch.check_pristine(installed, data)
        result[repo_path] = data
    return result


def apply_patches(tree: pathlib.Path, patches: series_mod.Series, sources: Dict[str, bytes]) -> Dict[str, bytes]:
    """Apply the series to copies of ``sources`` under ``tree``; returns the patched bytes."""
    for repo_path, data in sources.items():
        (tree / repo_path).parent.mkdir(parents=True, exist_ok=True)
        (tree / repo_path).write_bytes(data)
    includes = [f"--include={p}" for p in patches.applied]
    for patch in patches.patches:
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
    return {p: (tree / p).read_bytes() for p in patches.applied}


def additions_source(patches: series_mod.Series) -> str:
    """The translation unit of the compiled files' additions, with #line markers into the patched files."""
    parts = [
        "// Generated by torch_overlay from patches/: the lines the series adds to",
        *(f"// {path}" for path in series_mod.COMPILED),
        "// Do not edit; edit the patches.",
        '#include "reducer_prelude.h"',
        "",
        "namespace c10d {",
    ]
    for fragment in patches.fragments:
        parts.append(f"// {fragment.patch}")
        parts.append(f'#line {fragment.first_line} "{fragment.path}"')
        parts.append(fragment.text.rstrip("\n"))
    parts.append("} // namespace c10d")
    return "\n".join(parts) + "\n"


def build_cache() -> pathlib.Path:
    """Where built extensions are kept, by what they were built from."""
    return pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "torch_overlay"


def compile_extension(build: pathlib.Path, include: pathlib.Path, patches: series_mod.Series) -> pathlib.Path:
    """Compile the additions and bindings; returns the built module's path.

    A module built before from the same sources and headers, for the same torch,
    is taken from the build cache instead: series that differ only in Python,
    such as most of scripts/mutants' mutants, then install in seconds.
    """
    source = additions_source(patches)
    key = hashlib.sha256(source.encode())
    for name in ("bindings.cpp", "reducer_prelude.h"):
        key.update(name.encode() + b"\0" + (OVERLAY_DIR / name).read_bytes())
    for header in sorted(p for p in include.rglob("*") if p.is_file()):
        key.update(str(header.relative_to(include)).encode() + b"\0" + header.read_bytes())
    key.update(importlib.metadata.version("torch").encode() + b"\0" + sys.version.encode())
    cached_dir = build_cache() / key.hexdigest()[:32]
    cached = sorted(cached_dir.glob("_C*.so"))
    if cached:
        progress(f"the extension was built from these sources before: {cached_dir}")
        return cached[0]

    from torch.utils import cpp_extension

    if shutil.which("c++") is None and shutil.which("g++") is None:
        raise OverlayError("no C++ compiler found (c++ or g++); install one, e.g. apt-get install g++")
    additions = build / "reducer_additions.cpp"
    additions.write_text(source)
    progress(f"compiling {len(patches.fragments)} addition(s) to reducer.cpp and logger.cpp, and the bindings")
    try:
        module = cpp_extension.load(
            name="_C",
            sources=[str(OVERLAY_DIR / "bindings.cpp"), str(additions)],
            extra_include_paths=[str(include), str(OVERLAY_DIR)],
            build_directory=str(build),
            with_cuda=False,
            verbose=False,
        )
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        raise OverlayError(f"building the overlay extension failed:\n{e}") from e
    built = pathlib.Path(module.__file__)
    from torch._C._distributed_c10d import Logger, Reducer

    missing = [name for name in patches.bound_methods if not hasattr(Reducer, name) and not hasattr(Logger, name)]
    if missing:
        raise OverlayError(f"the extension built but did not bind {missing} onto Reducer or Logger")
    cached_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(built, cached_dir / (built.name + ".partial"))
    (cached_dir / (built.name + ".partial")).rename(cached_dir / built.name)
    return built


def install(repo: pathlib.Path, torch: Torch, build: Callable[..., pathlib.Path] = compile_extension) -> None:
    """Install the overlay generated from ``repo``'s patches into ``torch``'s site-packages.

    Args:
        repo: the repository, whose ``patches/`` the overlay is generated from.
        torch: the torch distribution to patch.
        build: compiles the extension; called as ``build(build_dir, include_dir, series)``
            and returns the built module's path.
    """
    try:
        versions.check(torch.version)
    except versions.UnsupportedTorch as e:
        raise OverlayError(str(e)) from e
    patches = series_mod.read_series(repo / "patches", torch.site_packages)
    new_stamp = stamp(patches)
    manifest = Manifest.read(torch.site_packages)
    if manifest is not None and manifest.stamp == new_stamp and not problems(torch, manifest):
        progress(f"already installed and up to date with patches/ ({len(patches.patches)} patches)")
        return
    if manifest is not None:
        progress("installed overlay is out of date with patches/: rebuilding")

    sources = originals(torch, manifest, patches.applied)
    with tempfile.TemporaryDirectory(prefix="torch_overlay.") as tmp:
        tmp_dir = pathlib.Path(tmp)
        progress(f"applying {len(patches.patches)} patches to {', '.join(patches.applied)}")
        patched = apply_patches(tmp_dir / "tree", patches, sources)
        include = tmp_dir / "include"
        for repo_path, data in patched.items():
            if repo_path.endswith(series_mod.HEADER_SUFFIXES):
                (include / repo_path).parent.mkdir(parents=True, exist_ok=True)
                (include / repo_path).write_bytes(data)
        build_dir = tmp_dir / "build"
        build_dir.mkdir()
        built = build(build_dir, include, patches)

        package_new = torch.site_packages / (PACKAGE + ".new")
        shutil.rmtree(package_new, ignore_errors=True)
        package_new.mkdir()
        shutil.copy2(OVERLAY_DIR / "site_hook.py", package_new / "__init__.py")
        shutil.copy2(built, package_new / built.name)
        files = {}
        for repo_path, data in sources.items():
            installed = series_mod.installed_path(repo_path)
            backup = package_new / "backup" / installed
            backup.parent.mkdir(parents=True, exist_ok=True)
            backup.write_bytes(data)
            files[installed] = {"original": sha256(data), "patched": sha256(patched[repo_path])}
        Manifest(new_stamp, torch.version, files).write(package_new)

        progress("writing the patched files into " + str(torch.site_packages))
        try:
            for repo_path, data in patched.items():
                write_atomically(torch.site_packages / series_mod.installed_path(repo_path), data)
            shutil.rmtree(torch.site_packages / PACKAGE, ignore_errors=True)
            package_new.rename(torch.site_packages / PACKAGE)
            (torch.site_packages / (PACKAGE + ".pth")).write_text(f"import {PACKAGE}\n")
        except BaseException:
            for repo_path, data in sources.items():
                write_atomically(torch.site_packages / series_mod.installed_path(repo_path), data)
            shutil.rmtree(package_new, ignore_errors=True)
            raise
    progress(f"installed: torch {torch.version} now has DistributedDataParallel._update_process_group")


def write_atomically(path: pathlib.Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".overlay-tmp")
    tmp.write_bytes(data)
    shutil.copymode(path, tmp)
    tmp.replace(path)


def problems(torch: Torch, manifest: Manifest) -> List[str]:
    """What differs between the installed overlay and its manifest."""
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


def status(repo: pathlib.Path, torch: Torch) -> int:
    """Print what is installed; 0 when it matches patches/, 1 when not installed, 2 when stale."""
    print(f"torch {torch.version} in {torch.site_packages}")
    manifest = Manifest.read(torch.site_packages)
    if manifest is None:
        print("overlay: not installed")
        return 1
    found = problems(torch, manifest)
    patches = series_mod.read_series(repo / "patches", torch.site_packages)
    if manifest.stamp != stamp(patches):
        found.append("patches/ or the overlay sources changed since it was installed")
    for installed in manifest.files:
        print(f"  patched: {installed}")
    if found:
        print("overlay: installed, out of date")
        for problem in found:
            print(f"  {problem}")
        print("  run scripts/overlay install to rebuild it")
        return 2
    print(f"overlay: installed, matches patches/ ({len(patches.patches)} patches)")
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
