"""Who refers to a function of libtorch, and how: the check that makes carrying a change to it sound.

The overlay carries a change to a function of libtorch in one of two ways (see
redirect.cpp and codegen.py):

* **redirected**: the patched definition keeps the function's signature, and
  every relocation that refers to the function (a PLT call, an address loaded
  from the GOT, a vtable slot) is pointed at it when the extension loads. Sound
  only where every reference in the wheel's libraries is such a relocation: a
  direct call, or an address computed in code, would stay on libtorch's
  definition. So is a function that gains a prologue, and a destructor that a
  shim wraps.
* **through its binding**: the series changes the function's signature, so the
  old one stays libtorch's, and the Python binding that init.cpp's hunks change
  is replaced. Sound only where nothing but that binding calls the old one.

This module finds every reference to a symbol in the wheel's shared libraries,
with binutils:

* ``nm -D`` gives the function's symbol in the library that defines it;
* ``readelf -r`` tells which other libraries refer to the symbol at all;
* ``objdump -d`` of those libraries and of the defining one gives each
  instruction that names the symbol, and the function it lies in: a call or
  jump through its PLT entry (``<symbol@plt>``) goes through a relocation;
  any other (a direct call, ``<symbol>`` or ``<symbol.localalias>``, or an
  address taken with ``lea``) does not.

A reference through a function pointer that a library stored in its data
without a relocation against the symbol cannot be seen; PyTorch's libraries
are built with -fPIC, so a pointer to an exported function in data is a
relocation against its symbol, which redirect.cpp rewrites too.

A call site is the binding when it lies in a pybind11 dispatcher of a lambda
of ``c10d_init``, the function of init.cpp that binds
``torch._C._distributed_c10d``, whose first parameter is the ``c10d::Reducer``
it binds a method of: ``pybind11::cpp_function::initialize<...>`` (the
pybind11 of torch 2.11), or the ``pybind11::detail::function_ref<...>``
callback that a newer pybind11 calls the lambda through (torch 2.14).
"""

import dataclasses
import hashlib
import json
import pathlib
import re
import shutil
import subprocess
from typing import Dict, List, Optional, Sequence, Tuple

from torch_overlay import cache

TOOLS = ("nm", "readelf", "objdump", "c++filt")
BINDING = re.compile(
    r"^(?:void )?pybind11::(?:cpp_function::initialize<|detail::function_ref<)"
    r".*\bc10d_init\(_object\*, _object\*\)::\{lambda\(c10d::Reducer&"
)
_FUNCTION_LABEL = re.compile(r"^[0-9a-f]+ <(?P<symbol>[^>]+)>:$")


class CallersError(Exception):
    """The references could not be found; the message says why."""


@dataclasses.dataclass(frozen=True)
class Reference:
    """An instruction of a library that names a symbol."""

    library: str
    referrer: str  # the demangled function the instruction lies in
    # A call or jump through the symbol's PLT entry, whose GOT slot is a relocation.
    through_relocation: bool

    @property
    def is_binding(self) -> bool:
        return BINDING.match(self.referrer) is not None

    def describe(self) -> str:
        """Return where the reference lies, for a message."""
        how = (
            "calls it through its PLT"
            if self.through_relocation
            else "refers to it directly"
        )
        return f"{self.referrer} in {self.library} ({how})"


def _run(cmd: Sequence[str]) -> str:
    result = subprocess.run(list(cmd), capture_output=True, text=True)
    if result.returncode != 0:
        raise CallersError(
            f"{' '.join(cmd[:2])} ... failed: {result.stderr.strip()[:500]}"
        )
    return result.stdout


def _demangle(symbols: List[str]) -> List[str]:
    if not symbols:
        return []
    result = subprocess.run(
        ["c++filt"], input="\n".join(symbols) + "\n", capture_output=True, text=True
    )
    if result.returncode != 0:
        raise CallersError(f"c++filt failed: {result.stderr.strip()}")
    return result.stdout.splitlines()


def check_tools() -> None:
    """Raise CallersError unless binutils is on PATH."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise CallersError(
            f"{', '.join(missing)} not found: install binutils (apt-get install binutils)"
        )


def find_definitions(lib_dir: pathlib.Path, part: str) -> List[Tuple[str, str, str]]:
    """Return (mangled, demangled, library) of every function of ``lib_dir`` whose demangled name holds ``part``.

    Only the libtorch libraries are searched, for their exported definitions.
    """
    check_tools()
    found = []
    for library in sorted(lib_dir.glob("libtorch*.so")):
        listing = ["nm", "-D", "--defined-only", str(library)]
        # The same symbols in the same order, mangled and demangled.
        mangled = _run(listing).splitlines()
        demangled = _run(listing[:1] + ["-C"] + listing[1:]).splitlines()
        for symbol, readable in zip(mangled, demangled):
            fields = symbol.split()
            if len(fields) == 3 and fields[1] in "TW" and part in readable:
                found.append((fields[2], readable.split(" ", 2)[2], library.name))
    return found


def find_defining_libraries(
    lib_dir: pathlib.Path, symbols: Sequence[str]
) -> Dict[str, str]:
    """Return the library of ``lib_dir`` that defines each of ``symbols``.

    Raises CallersError for a symbol that no library defines.
    """
    check_tools()
    found: Dict[str, str] = {}
    for library in sorted(lib_dir.glob("libtorch*.so")):
        defined = {
            line.split()[-1]
            for line in _run(["nm", "-D", "--defined-only", str(library)]).splitlines()
        }
        for symbol in symbols:
            if symbol in defined:
                found.setdefault(symbol, library.name)
    missing = [s for s in symbols if s not in found]
    if missing:
        raise CallersError(f"no library in {lib_dir} defines {', '.join(missing)}")
    return found


def find_references(
    lib_dir: pathlib.Path, symbols: Dict[str, str]
) -> Dict[str, List[Reference]]:
    """Return every instruction of the libraries of ``lib_dir`` that names each symbol.

    ``symbols`` maps each symbol to the library that defines it, which is always
    searched; each library is disassembled once, for all of them.
    """
    check_tools()
    found: Dict[str, List[Reference]] = {symbol: [] for symbol in symbols}
    for library in sorted(lib_dir.glob("*.so*")):
        relocations = None
        wanted = []
        for symbol, defined_in in symbols.items():
            if library.name != defined_in:
                if relocations is None:
                    relocations = _run(["readelf", "-rW", str(library)])
                if symbol not in relocations:
                    continue
            wanted.append(symbol)
        known = {s: _read_cached(library, s) for s in wanted}
        for symbol, references in known.items():
            if references is not None:
                found[symbol] += references
        wanted = [s for s in wanted if known[s] is None]
        if not wanted:
            continue
        named = {
            s: re.compile(
                rf"<{re.escape(s)}(?P<how>@plt|\.localalias)?(?:\+0x[0-9a-f]+)?>"
            )
            for s in wanted
        }
        referrers: Dict[str, List[Tuple[str, bool]]] = {s: [] for s in wanted}
        current = ""
        # Streamed: the disassembly of libtorch_cpu.so runs to gigabytes.
        cmd = ["objdump", "-d", "--no-show-raw-insn", str(library)]
        with subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        ) as objdump:
            assert objdump.stdout is not None
            for line in objdump.stdout:
                label = _FUNCTION_LABEL.match(line.rstrip("\n"))
                if label:
                    current = label.group("symbol")
                    continue
                for symbol in wanted:
                    if symbol not in line:
                        continue
                    match = named[symbol].search(line)
                    own = current.split("@")[0].split(".")[0] == symbol
                    if match is None or own:
                        continue
                    through_plt = match["how"] == "@plt" and re.search(
                        r"\s(call|jmp)\s", line
                    )
                    referrers[symbol].append((current, bool(through_plt)))
        if objdump.returncode != 0:
            raise CallersError(
                f"objdump -d {library} failed with exit code {objdump.returncode}"
            )
        for symbol in wanted:
            names = _demangle([r for r, _ in referrers[symbol]])
            references = [
                Reference(library.name, name, plt)
                for name, (_, plt) in zip(names, referrers[symbol])
            ]
            _write_cached(library, symbol, references)
            found[symbol] += references
    return found


def _locate_cache_file(library: pathlib.Path, symbol: str) -> pathlib.Path:
    """Return where the references of ``library`` to ``symbol`` are kept.

    Disassembling libtorch_cpu.so takes minutes; its references depend only on
    the file, which its path, size and modification time stand for.
    """
    stat = library.stat()
    key = hashlib.sha256(
        f"{library.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\0{symbol}".encode()
    )
    return cache.locate_cache() / "references" / f"{key.hexdigest()[:32]}.json"


def _read_cached(library: pathlib.Path, symbol: str) -> Optional[List[Reference]]:
    path = _locate_cache_file(library, symbol)
    if not path.is_file():
        return None
    return [Reference(**fields) for fields in json.loads(path.read_text())]


def _write_cached(
    library: pathlib.Path, symbol: str, references: List[Reference]
) -> None:
    path = _locate_cache_file(library, symbol)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps([dataclasses.asdict(r) for r in references]))
    partial.replace(path)


def find_unsound_redirects(
    lib_dir: pathlib.Path, symbols: Sequence[str]
) -> Dict[str, List[Reference]]:
    """Return, for each symbol to redirect, the references that no relocation carries.

    Empty lists where redirecting it reaches every caller in the wheel.
    """
    if not symbols:
        return {}
    references = find_references(lib_dir, find_defining_libraries(lib_dir, symbols))
    return {
        symbol: [r for r in found if not r.through_relocation]
        for symbol, found in references.items()
    }


def find_unsound_binding_replacements(
    lib_dir: pathlib.Path, symbols: Sequence[str]
) -> Dict[str, List[Reference]]:
    """Return, for each symbol whose binding the overlay replaces, its callers but that binding.

    A symbol with no call site at all gets one that says so: then its binding,
    at least, calls it in a way the check cannot see.
    """
    if not symbols:
        return {}
    references = find_references(lib_dir, find_defining_libraries(lib_dir, symbols))
    unsound: Dict[str, List[Reference]] = {}
    for symbol, found in references.items():
        if not found:
            found = [
                Reference("", "no call site was found, not even its binding's", True)
            ]
        unsound[symbol] = [r for r in found if not r.is_binding]
    return unsound
