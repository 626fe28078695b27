"""Build the overlay's extension from the generated sources, or take it from the build cache."""

import fcntl
import hashlib
import importlib.metadata
import pathlib
import shutil
import subprocess
import sys
from typing import List, Sequence

from torch_overlay import cache, callers, codegen, cpp_classes
from torch_overlay.cpp_classes import AddedMember
from torch_overlay.reporting import OverlayError, progress
from torch_overlay.series import Series

OVERLAY_DIR = pathlib.Path(__file__).resolve().parent


def describe_torch() -> str:
    """Describe what an extension built here is only good for: this torch and this Python."""
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


# The overlay's own C++, besides the generated sources.
CPP_SOURCES = ("redirect.cpp",)
CPP_HEADERS = ("reducer_prelude.h", "redirect.h")
# Where the wheel's include directory keeps c10d's headers.
C10D_HEADERS = "torch/csrc/distributed/c10d"


def find_prologue_targets(
    headers: pathlib.Path, lib_dir: pathlib.Path, series: Series
) -> List[codegen.PrologueTarget]:
    """Return, for each prologue of the series, its symbol in the wheel and its class's base.

    Args:
        headers: the wheel's c10d headers, which declare the classes.
        lib_dir: the wheel's libraries, which define the functions.
        series: the series.

    Raises OverlayError where no library of the wheel exports the function, or
    no header declares its class with a base.
    """
    if not series.prologues:
        return []
    declared = {}
    for header in sorted(headers.rglob("*.h*")):
        classes, _ = cpp_classes.scan(header.read_text(errors="replace"))
        declared.update({c.qualified: c for c in classes})
    targets = []
    for prologue in series.prologues:
        try:
            defined = callers.find_definitions(lib_dir, "::" + prologue.name + "(")
        except callers.CallersError as e:
            raise OverlayError(str(e)) from e
        if len(defined) != 1:
            raise OverlayError(
                f"{prologue.path}: the series adds statements at the start of "
                f"{prologue.name}, which {len(defined)} functions of the wheel's libraries "
                "define, not one"
            )
        symbol, demangled, _ = defined[0]
        qualified = demangled.split("(", 1)[0].rsplit("::", 1)[0]
        klass = declared.get(qualified)
        if klass is None or not klass.bases:
            raise OverlayError(
                f"{prologue.path}: no header of the wheel declares {qualified} with a "
                f"base, whose member the statements that {prologue.name} gains are"
            )
        targets.append(
            codegen.PrologueTarget(
                prologue=prologue,
                symbol=symbol,
                namespace=qualified.rsplit("::", 1)[0],
                base=klass.bases[0],
            )
        )
    return targets


def build_extension(
    include: pathlib.Path, series: Series, members: Sequence[AddedMember] = ()
) -> pathlib.Path:
    """Compile the extension; return the built module's path.

    Args:
        include: the wheel's headers as the series patches them, without the
            data members it adds (``members``).
        series: the series.
        members: the data members that the series adds to classes of the
            wheel, which the extension carries in shims.

    A module built before from the same sources and headers, for the same torch,
    is taken from the build cache instead: series that differ only in Python,
    such as most of scripts/mutants' mutants, then install in seconds.
    """
    import torch

    wheel = pathlib.Path(torch.__file__).parent
    try:
        source = codegen.generate_additions(
            series,
            members,
            find_prologue_targets(
                wheel / "include" / C10D_HEADERS, wheel / "lib", series
            ),
        )
    except codegen.CodegenError as e:
        raise OverlayError(str(e)) from e
    renames = codegen.generate_renames(series, include)
    module_source = codegen.generate_module(series)
    key = hashlib.sha256(
        source.encode() + b"\0" + renames.encode() + b"\0" + module_source.encode()
    )
    for name in CPP_SOURCES + CPP_HEADERS:
        key.update(name.encode() + b"\0" + (OVERLAY_DIR / name).read_bytes())
    for header in sorted(p for p in include.rglob("*") if p.is_file()):
        key.update(
            str(header.relative_to(include)).encode() + b"\0" + header.read_bytes()
        )
    key.update(describe_torch().encode())
    cached_dir = cache.locate_cache() / key.hexdigest()[:32]
    cached = sorted(cached_dir.glob("_C*.so"))
    if cached:
        progress(f"the extension was built from these sources before: {cached_dir}")
        return cached[0]

    from torch.utils import cpp_extension

    if shutil.which("c++") is None and shutil.which("g++") is None:
        raise OverlayError(
            "no C++ compiler found (c++ or g++); install one, e.g. apt-get install g++"
        )
    import torch._C._distributed_c10d as c10d

    # The wheel's own bindings of the names the extension binds: those it changes
    # must be gone once it has loaded.
    stock = {
        (b.owner, b.name): getattr(c10d, b.owner).__dict__.get(b.name)
        for b in series.bindings
    }
    progress(
        f"compiling {len(series.added)} added and {len(series.replaced)} changed "
        f"function(s), {len(series.prologues)} prologue(s), {len(members)} added data "
        "member(s), and the bindings"
    )
    # One ninja directory per torch and Python, kept between builds, whose inputs are
    # written only where they changed: a series that changes only reducer.cpp's lines,
    # such as a C++ mutant, recompiles only them.
    work = (
        cache.locate_cache()
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
        module_file = work / "build" / "module.cpp"
        write_if_changed(module_file, module_source)
        write_if_changed(work / "build" / codegen.RENAMES_HEADER, renames)
        try:
            module = cpp_extension.load(
                name="_C",
                sources=[str(OVERLAY_DIR / name) for name in CPP_SOURCES]
                + [str(additions), str(module_file)],
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
    missing = [
        f"{b.owner}.{b.name}"
        for b in series.bindings
        if getattr(c10d, b.owner).__dict__.get(b.name) is stock[b.owner, b.name]
    ]
    if missing:
        raise OverlayError(f"the extension built but did not bind {', '.join(missing)}")
    cached_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(built, cached_dir / (built.name + ".partial"))
    (cached_dir / (built.name + ".partial")).rename(cached_dir / built.name)
    return built
