"""Who calls a function of libtorch: the check that makes replacing it by its binding sound.

The overlay replaces a function of libtorch that the series changes
(``series.ReplacedFunction``) by compiling the patched definition under another
symbol and binding that in place of the function's Python binding. That is
only sound if nothing but the binding calls the old definition: no other code
of libtorch, and no other binding. This module finds every call site of the
function in the wheel's shared libraries, with binutils:

* ``nm -D`` gives the function's symbol in the library that defines it;
* ``readelf -r`` tells which libraries refer to the symbol at all. PyTorch's
  libraries are built with -fPIC and without -fno-semantic-interposition or
  -Bsymbolic, so even a call from the defining library itself goes through
  its procedure linkage table and has a relocation;
* ``objdump -d`` of those libraries gives each call or jump to the symbol's
  PLT entry, and the function it lies in.

A call site is the binding when it lies in a pybind11 dispatcher
(``pybind11::cpp_function::initialize<...>``) of a lambda of ``c10d_init``,
the function of init.cpp that binds ``torch._C._distributed_c10d``.
"""

import dataclasses
import pathlib
import re
import shutil
import subprocess
from typing import Dict, List, Sequence

TOOLS = ("nm", "readelf", "objdump", "c++filt")
BINDING = re.compile(r"^pybind11::cpp_function::initialize<.*\bc10d_init\(")
_FUNCTION_LABEL = re.compile(r"^[0-9a-f]+ <(?P<symbol>[^>]+)>:$")


class CallersError(Exception):
    """The call sites could not be found; the message says why."""


@dataclasses.dataclass(frozen=True)
class CallSite:
    library: str
    caller: str  # the demangled function the call lies in

    @property
    def is_binding(self) -> bool:
        return BINDING.match(self.caller) is not None


def _run(cmd: Sequence[str]) -> str:
    result = subprocess.run(list(cmd), capture_output=True, text=True)
    if result.returncode != 0:
        raise CallersError(f"{' '.join(cmd[:2])} ... failed: {result.stderr.strip()[:500]}")
    return result.stdout


def _demangle(symbols: List[str]) -> List[str]:
    if not symbols:
        return []
    result = subprocess.run(["c++filt"], input="\n".join(symbols) + "\n", capture_output=True, text=True)
    if result.returncode != 0:
        raise CallersError(f"c++filt failed: {result.stderr.strip()}")
    return result.stdout.splitlines()


def symbols_of(lib_dir: pathlib.Path, qualified_names: Sequence[str]) -> Dict[str, str]:
    """The dynamic symbol of each function ``c10d::NAME`` that a library in ``lib_dir`` defines."""
    found: Dict[str, str] = {}
    for library in sorted(lib_dir.glob("libtorch*.so")):
        listing = ["nm", "-D", "--defined-only", str(library)]
        # The same symbols in the same order, mangled and demangled.
        mangled = _run(listing).splitlines()
        demangled = _run(listing[:1] + ["-C"] + listing[1:]).splitlines()
        for symbol, readable in zip(mangled, demangled):
            for name in qualified_names:
                if f" c10d::{name}(" in readable:
                    found[name] = symbol.split()[-1]
    missing = [n for n in qualified_names if n not in found]
    if missing:
        raise CallersError(f"no library in {lib_dir} defines {', '.join('c10d::' + n for n in missing)}")
    return found


def call_sites(lib_dir: pathlib.Path, symbol: str) -> List[CallSite]:
    """Every call of ``symbol`` in the libraries of ``lib_dir``, with the function it lies in."""
    sites: List[CallSite] = []
    for library in sorted(lib_dir.glob("*.so*")):
        if symbol not in _run(["readelf", "-rW", str(library)]):
            continue
        callers = []
        current = ""
        for line in _run(["objdump", "-d", "--no-show-raw-insn", str(library)]).splitlines():
            label = _FUNCTION_LABEL.match(line)
            if label:
                current = label.group("symbol")
            elif f"<{symbol}@plt>" in line and re.search(r"\s(call|jmp)\s", line) and current != f"{symbol}@plt":
                callers.append(current)
        sites += [CallSite(library.name, caller) for caller in _demangle(callers)]
    return sites


def unsound_replacements(lib_dir: pathlib.Path, qualified_names: Sequence[str]) -> Dict[str, List[CallSite]]:
    """For each function, the call sites other than its binding; empty lists where replacing it is sound.

    Raises CallersError when binutils is missing, or no library defines a function.
    """
    missing_tools = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing_tools:
        raise CallersError(f"{', '.join(missing_tools)} not found: install binutils (apt-get install binutils)")
    symbols = symbols_of(lib_dir, qualified_names)
    return {name: [s for s in call_sites(lib_dir, symbols[name]) if not s.is_binding] for name in qualified_names}
