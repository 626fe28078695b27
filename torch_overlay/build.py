"""Build the overlay's extension from the generated sources, or take it from the build cache."""

import fcntl
import hashlib
import importlib.metadata
import os
import pathlib
import shutil
import subprocess
import sys

from torch_overlay import codegen
from torch_overlay.reporting import OverlayError, progress
from torch_overlay.series import Series

OVERLAY_DIR = pathlib.Path(__file__).resolve().parent


def locate_build_cache() -> pathlib.Path:
    """Where built extensions are kept, by what they were built from."""
    return (
        pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
        / "torch_overlay"
    )


def describe_torch() -> str:
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


def build_extension(include: pathlib.Path, series: Series) -> pathlib.Path:
    """Compile the additions and bindings; returns the built module's path.

    A module built before from the same sources and headers, for the same torch,
    is taken from the build cache instead: series that differ only in Python,
    such as most of scripts/mutants' mutants, then install in seconds.
    """
    source = codegen.generate_additions(series)
    renames = codegen.generate_renames(series, include)
    key = hashlib.sha256(source.encode() + b"\0" + renames.encode())
    for name in ("bindings.cpp", "reducer_prelude.h"):
        key.update(name.encode() + b"\0" + (OVERLAY_DIR / name).read_bytes())
    for header in sorted(p for p in include.rglob("*") if p.is_file()):
        key.update(
            str(header.relative_to(include)).encode() + b"\0" + header.read_bytes()
        )
    key.update(describe_torch().encode())
    cached_dir = locate_build_cache() / key.hexdigest()[:32]
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
        r.binding: StockReducer.__dict__.get(r.binding) for r in series.replaced
    }
    unbound = [
        f"c10d::{r.name} ({r.binding})"
        for r in series.replaced
        if replaced_bindings[r.binding] is None
    ]
    if unbound:
        raise OverlayError(
            f"the series changes {', '.join(unbound)}, which torch {importlib.metadata.version('torch')} "
            "does not bind on torch._C._distributed_c10d.Reducer: the overlay can only replace a "
            "function through its Python binding"
        )
    progress(
        f"compiling {len(series.fragments)} addition(s) to reducer.cpp and logger.cpp, "
        f"{len(series.replaced)} replaced function(s), and the bindings"
    )
    # One ninja directory per torch and Python, kept between builds, whose inputs are
    # written only where they changed: a series that changes only reducer.cpp's lines,
    # such as a C++ mutant, recompiles only them.
    work = (
        locate_build_cache()
        / "work"
        / hashlib.sha256(describe_torch().encode()).hexdigest()[:16]
    )
    work.mkdir(parents=True, exist_ok=True)
    with open(work / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sync_tree(include, work / "include")
        (work / "build").mkdir(exist_ok=True)
        additions = work / "build" / "reducer_additions.cpp"
        write_if_changed(additions, source)
        write_if_changed(work / "build" / codegen.RENAMES_HEADER, renames)
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
        for name in series.bound_methods
        if not hasattr(Reducer, name) and not hasattr(Logger, name)
    ]
    missing += [
        r.binding
        for r in series.replaced
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
