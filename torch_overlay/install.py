"""Install, inspect and remove the overlay in the running interpreter's torch.

Runs inside the overlay venv (``python -m torch_overlay``), next to the torch it
patches. What it installs, all generated from ``patches/``:

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

import base64
import dataclasses
import fcntl
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

from torch_overlay import bases, callers, series as series_mod

PACKAGE = "_ddp_update_process_group_overlay"
# Where the series changes DDP's Python, the Reducer methods it calls are the overlay's.
# The .pth file loads them at start-up, but not under `python -S` (or wherever site is
# skipped), where DDP would call the stock Reducer's: so the patched distributed.py
# loads them itself as it is imported, and fails to import without them.
DDP_MODULE = "torch/nn/parallel/distributed.py"


def load_extension_source(torch_version: str) -> str:
    """What the overlay appends to the installed distributed.py of torch ``torch_version``."""
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


OVERLAY_DIR = pathlib.Path(__file__).resolve().parent
# Overlay sources that change what gets installed, besides the patches.
OVERLAY_SOURCES = (
    "bindings.cpp",
    "reducer_prelude.h",
    "site_hook.py",
    "install.py",
    "series.py",
    "callers.py",
)
RENAMES_HEADER = "overlay_renames.h"
# The headers whose declarations of replaced functions the renames change.
RENAMED_HEADERS = (
    "torch/csrc/distributed/c10d/reducer.hpp",
    "torch/csrc/distributed/c10d/logger.hpp",
)


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


def stamp(patches: series_mod.Series) -> str:
    h = hashlib.sha256(patches.digest().encode())
    for name in OVERLAY_SOURCES:
        h.update((OVERLAY_DIR / name).read_bytes())
    return h.hexdigest()


def originals(
    torch: Torch, manifest: Optional[Manifest], applied: List[str]
) -> Dict[str, bytes]:
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


def apply_patches(
    tree: pathlib.Path, patches: series_mod.Series, sources: Dict[str, bytes]
) -> Dict[str, bytes]:
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
    """The translation unit of what the series adds to the compiled files and the functions it
    changes there, with #line markers into the patched files."""
    parts = [
        "// Generated by torch_overlay from the patch series: what the series adds to",
        *(f"// {path}" for path in series_mod.COMPILED),
        "// and the functions of libtorch that it changes, under the names of",
        f"// {RENAMES_HEADER}. Do not edit; edit the patches.",
        '#include "reducer_prelude.h"',
        "",
        "namespace c10d {",
    ]
    # Constants first: the functions, replaced and added, may use them.
    for fragment in (f for f in patches.fragments if f.declaration):
        parts.append(f"// {fragment.patch}")
        parts.append(f'#line {fragment.first_line} "{fragment.path}"')
        parts.append(fragment.text.rstrip("\n"))
    for replaced in patches.replaced:
        parts.append(f"// replaces c10d::{replaced.name}")
        parts.append(f'#line {replaced.first_line} "{replaced.path}"')
        parts.append(replaced.text.rstrip("\n"))
    for fragment in (f for f in patches.fragments if not f.declaration):
        parts.append(f"// {fragment.patch}")
        parts.append(f'#line {fragment.first_line} "{fragment.path}"')
        parts.append(fragment.text.rstrip("\n"))
    parts.append("} // namespace c10d")
    return "\n".join(parts) + "\n"


def binding_macro(name: str) -> str:
    """The macro that switches on bindings.cpp's binding of ``name``, such as ``_reset_state``."""
    return "TORCH_OVERLAY_BIND_" + name.lstrip("_").upper()


def renames_source(patches: series_mod.Series, include: pathlib.Path) -> str:
    """The header that gives each replaced function its overlay name in the extension,
    and switches on the bindings that the series makes.

    It includes what reducer.hpp and logger.hpp include first, so that the
    macros only reach the declarations in those two headers (other headers
    have members of the same names, such as PhiloxRNGEngine's reset_state),
    and the patched definitions and bindings that come after them.
    bindings.cpp binds what the whole series binds, each binding under its
    :func:`binding_macro`: a series cut short (scripts/mutants, a commit
    of the stack) binds what it has.
    """
    parts = [
        "// Generated by torch_overlay from the patch series: the functions of libtorch",
        "// that the series changes, compiled under other names (see series.ReplacedFunction),",
        "// and the bindings of bindings.cpp that the series makes.",
        "#pragma once",
    ]
    if patches.replaced:
        for header in RENAMED_HEADERS:
            for line in (include / header).read_text().splitlines():
                target = line.split("#include", 1)[-1].strip().strip('<>"')
                if line.startswith("#include") and target not in RENAMED_HEADERS:
                    parts.append(line)
        for replaced in patches.replaced:
            parts.append(f"#define {replaced.member} {replaced.symbol}")
    for name in sorted(patches.bound_methods + [r.binding for r in patches.replaced]):
        parts.append(f"#define {binding_macro(name)}")
    return "\n".join(parts) + "\n"


def build_cache() -> pathlib.Path:
    """Where built extensions are kept, by what they were built from."""
    return (
        pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
        / "torch_overlay"
    )


def key_of_torch() -> str:
    """What an extension built here is only good for: this torch and this Python."""
    return importlib.metadata.version("torch") + "\0" + sys.version


def write_if_changed(path: pathlib.Path, text: str) -> None:
    """Write ``text`` unless ``path`` holds it already, so that ninja sees no change."""
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def sync_tree(source: pathlib.Path, target: pathlib.Path) -> None:
    """Make ``target`` hold exactly ``source``'s files, touching only those that differ."""
    wanted = {p.relative_to(source) for p in source.rglob("*") if p.is_file()}
    for p in [p for p in target.rglob("*") if p.is_file()] if target.exists() else []:
        if p.relative_to(target) not in wanted:
            p.unlink()
    for relative in wanted:
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        write_if_changed(target / relative, (source / relative).read_text())


def compile_extension(
    include: pathlib.Path, patches: series_mod.Series
) -> pathlib.Path:
    """Compile the additions and bindings; returns the built module's path.

    A module built before from the same sources and headers, for the same torch,
    is taken from the build cache instead: series that differ only in Python,
    such as most of scripts/mutants' mutants, then install in seconds.
    """
    source = additions_source(patches)
    renames = renames_source(patches, include)
    key = hashlib.sha256(source.encode() + b"\0" + renames.encode())
    for name in ("bindings.cpp", "reducer_prelude.h"):
        key.update(name.encode() + b"\0" + (OVERLAY_DIR / name).read_bytes())
    for header in sorted(p for p in include.rglob("*") if p.is_file()):
        key.update(
            str(header.relative_to(include)).encode() + b"\0" + header.read_bytes()
        )
    key.update(key_of_torch().encode())
    cached_dir = build_cache() / key.hexdigest()[:32]
    cached = sorted(cached_dir.glob("_C*.so"))
    if cached:
        progress(f"the extension was built from these sources before: {cached_dir}")
        return cached[0]

    from torch.utils import cpp_extension

    if shutil.which("c++") is None and shutil.which("g++") is None:
        raise OverlayError(
            "no C++ compiler found (c++ or g++); install one, e.g. apt-get install g++"
        )
    from torch._C._distributed_c10d import Reducer as StockReducer

    # The wheel's own bindings of the replaced functions, which the extension replaces.
    replaced_bindings = {
        r.binding: StockReducer.__dict__.get(r.binding) for r in patches.replaced
    }
    unbound = [
        f"c10d::{r.name} ({r.binding})"
        for r in patches.replaced
        if replaced_bindings[r.binding] is None
    ]
    if unbound:
        raise OverlayError(
            f"the series changes {', '.join(unbound)}, which torch {importlib.metadata.version('torch')} "
            "does not bind on torch._C._distributed_c10d.Reducer: the overlay can only replace a "
            "function through its Python binding"
        )
    progress(
        f"compiling {len(patches.fragments)} addition(s) to reducer.cpp and logger.cpp, "
        f"{len(patches.replaced)} replaced function(s), and the bindings"
    )
    # One ninja directory per torch and Python, kept between builds, whose inputs are
    # written only where they changed: a series that changes only reducer.cpp's lines,
    # such as a C++ mutant, recompiles only them.
    work = (
        build_cache()
        / "work"
        / hashlib.sha256(key_of_torch().encode()).hexdigest()[:16]
    )
    work.mkdir(parents=True, exist_ok=True)
    with open(work / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sync_tree(include, work / "include")
        (work / "build").mkdir(exist_ok=True)
        additions = work / "build" / "reducer_additions.cpp"
        write_if_changed(additions, source)
        write_if_changed(work / "build" / RENAMES_HEADER, renames)
        try:
            module = cpp_extension.load(
                name="_C",
                sources=[str(OVERLAY_DIR / "bindings.cpp"), str(additions)],
                extra_include_paths=[
                    str(work / "include"),
                    str(OVERLAY_DIR),
                    str(work / "build"),
                ],
                build_directory=str(work / "build"),
                with_cuda=False,
                verbose=False,
            )
        except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
            raise OverlayError(f"building the overlay extension failed:\n{e}") from e
    built = pathlib.Path(module.__file__)
    from torch._C._distributed_c10d import Logger, Reducer

    missing = [
        name
        for name in patches.bound_methods
        if not hasattr(Reducer, name) and not hasattr(Logger, name)
    ]
    missing += [
        r.binding
        for r in patches.replaced
        if Reducer.__dict__.get(r.binding) is replaced_bindings[r.binding]
    ]
    if missing:
        raise OverlayError(
            f"the extension built but did not bind {missing} onto Reducer or Logger"
        )
    cached_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(built, cached_dir / (built.name + ".partial"))
    (cached_dir / (built.name + ".partial")).rename(cached_dir / built.name)
    return built


def install(
    repo: pathlib.Path,
    torch: Torch,
    base: bases.Base,
    build: Callable[..., pathlib.Path] = compile_extension,
    fixes_only: bool = False,
) -> None:
    """Install the overlay generated from ``base``'s series in ``repo`` into ``torch``'s site-packages.

    Args:
        repo: the repository, whose ``patches/<base>/`` the overlay is generated from.
        torch: the torch distribution to patch.
        base: the release whose series to carry; ``torch`` must be of its line.
        build: compiles the extension; called as ``build(include_dir, series)`` and
            returns the built module's path.
        fixes_only: carry only the patches that fix bugs, which the series starts
            with (through ``base.last_fix``); ``torch`` may then also be one of
            ``base.fixes_also_on``.
    """
    try:
        base.check_fixes(torch.version) if fixes_only else base.check(torch.version)
    except bases.UnsupportedTorch as e:
        raise OverlayError(str(e)) from e
    patches = read_base_series(repo, torch, base, fixes_only)
    new_stamp = stamp(patches)
    manifest = Manifest.read(torch.site_packages)
    if (
        manifest is not None
        and manifest.stamp == new_stamp
        and not problems(torch, manifest)
    ):
        progress(
            f"already installed and up to date with patches/ ({len(patches.patches)} patches)"
        )
        return
    if manifest is not None:
        progress("installed overlay is out of date with patches/: rebuilding")

    check_replacements(torch, patches)
    sources = originals(torch, manifest, patches.applied)
    # What an earlier series patched and this one does not goes back to the wheel's bytes.
    newly_applied = {series_mod.installed_path(p) for p in patches.applied}
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
            f"applying {len(patches.patches)} patches to {', '.join(patches.applied)}"
        )
        patched = apply_patches(tmp_dir / "tree", patches, sources)
        if DDP_MODULE in patched:
            patched[DDP_MODULE] += load_extension_source(torch.version).encode()
        include = tmp_dir / "include"
        for repo_path, data in patched.items():
            if repo_path.endswith(series_mod.HEADER_SUFFIXES):
                (include / repo_path).parent.mkdir(parents=True, exist_ok=True)
                (include / repo_path).write_bytes(data)
        # renames_source() reads both headers, patched or not.
        for header in RENAMED_HEADERS:
            if not (include / header).is_file():
                (include / header).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(
                    torch.site_packages / series_mod.installed_path(header),
                    include / header,
                )
        built = build(include, patches)

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
                    torch.site_packages / series_mod.installed_path(repo_path), data
                )
            shutil.rmtree(torch.site_packages / PACKAGE, ignore_errors=True)
            package_new.rename(torch.site_packages / PACKAGE)
            (torch.site_packages / (PACKAGE + ".pth")).write_text(f"import {PACKAGE}\n")
        except BaseException:
            for repo_path, data in sources.items():
                write_atomically(
                    torch.site_packages / series_mod.installed_path(repo_path), data
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
        f"installed: torch {torch.version} now carries {what} ({len(patches.patches)} patches)"
    )


def read_base_series(
    repo: pathlib.Path, torch: Torch, base: bases.Base, fixes_only: bool
) -> series_mod.Series:
    """``base``'s series in ``repo``, or its fixes alone."""
    try:
        count = len(base.fix_patches(repo)) if fixes_only else None
    except bases.UnsupportedTorch as e:
        raise OverlayError(str(e)) from e
    return series_mod.read_series(
        base.patches(repo), torch.site_packages, replaceable=base.has_api, count=count
    )


def check_replacements(torch: Torch, patches: series_mod.Series) -> None:
    """Refuse to replace a function that anything in libtorch calls but its Python binding.

    The answer depends only on the wheel and the functions, so it is kept in the
    build cache: finding the call sites takes a while.
    """
    names = sorted(r.name for r in patches.replaced)
    if not names:
        return
    key = hashlib.sha256(
        json.dumps(
            [torch.version, torch.record.get("torch/lib/libtorch_cpu.so"), names]
        ).encode()
    )
    cached = build_cache() / f"callers-{key.hexdigest()[:32]}.json"
    if cached.is_file():
        unsound = json.loads(cached.read_text())
    else:
        progress(
            f"checking that nothing in libtorch but the Python bindings calls {', '.join(names)}"
        )
        try:
            found = callers.unsound_replacements(
                torch.site_packages / "torch" / "lib", names
            )
        except callers.CallersError as e:
            raise OverlayError(
                f"cannot check who calls the functions the series changes: {e}"
            ) from e
        unsound = {
            name: [f"{s.caller} in {s.library}" for s in sites]
            for name, sites in found.items()
            if sites
        }
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(unsound))
    if unsound:
        details = "; ".join(
            f"c10d::{name} is called by {', '.join(sites)}"
            for name, sites in unsound.items()
        )
        raise OverlayError(
            "the series changes functions that libtorch calls other than through their Python "
            f"binding, so replacing the binding would leave those callers on the old code: {details}"
        )


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


def status(
    repo: pathlib.Path, torch: Torch, base: bases.Base, fixes_only: bool = False
) -> int:
    """Print what is installed; 0 when it matches patches/, 1 when not installed, 2 when stale."""
    print(f"torch {torch.version} in {torch.site_packages}")
    manifest = Manifest.read(torch.site_packages)
    if manifest is None:
        print("overlay: not installed")
        return 1
    found = problems(torch, manifest)
    patches = read_base_series(repo, torch, base, fixes_only)
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
