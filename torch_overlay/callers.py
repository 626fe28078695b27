"""Who calls a function of libtorch: the check that makes replacing it by its binding sound.

The overlay replaces a function of libtorch that the series changes
(``series.ReplacedFunction``) by compiling the patched definition under another
symbol and binding that in place of the function's Python binding. That is
only sound if nothing but the binding calls the old definition: no other code
of libtorch, and no other binding. This module finds every call site of the
function in the wheel's shared libraries, with binutils:

* ``nm -D`` gives the function's symbol in the library that defines it;
* ``readelf -r`` tells which other libraries refer to the symbol at all;
* ``objdump -d`` of those libraries and of the defining one gives each call or
  jump to the symbol, through its PLT entry or directly, and the function it
  lies in. (PyTorch's libraries are built with -fPIC and GCC's semantic
  interposition, so even calls within the defining library go through the
  PLT; the direct ones are looked for in case a build binds them locally.)

A call through a function pointer that was stored elsewhere would not show;
the functions the series changes are only taken by address in the bindings.
A function with no call site at all is reported too: then its binding, at
least, calls it in a way this check cannot see.

A call site is the binding when it lies in a pybind11 dispatcher of a lambda
of ``c10d_init``, the function of init.cpp that binds
``torch._C._distributed_c10d``, whose first parameter is the ``c10d::Reducer``
it binds a method of: ``pybind11::cpp_function::initialize<...>`` (the
pybind11 of torch 2.11), or the ``pybind11::detail::function_ref<...>``
callback that a newer pybind11 calls the lambda through (torch 2.14).
"""

import dataclasses
import pathlib
import re
import shutil
import subprocess
from typing import Dict, List, Sequence, Tuple

TOOLS = ("nm", "readelf", "objdump", "c++filt")
BINDING = re.compile(
    r"^(?:void )?pybind11::(?:cpp_function::initialize<|detail::function_ref<)"
    r".*\bc10d_init\(_object\*, _object\*\)::\{lambda\(c10d::Reducer&"
)
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


def symbols_of(
    lib_dir: pathlib.Path, qualified_names: Sequence[str]
) -> Dict[str, Tuple[str, str]]:
    """The dynamic symbol of each function ``c10d::NAME``, and the library in ``lib_dir`` that defines it."""
    found: Dict[str, Tuple[str, str]] = {}
    for library in sorted(lib_dir.glob("libtorch*.so")):
        listing = ["nm", "-D", "--defined-only", str(library)]
        # The same symbols in the same order, mangled and demangled.
        mangled = _run(listing).splitlines()
        demangled = _run(listing[:1] + ["-C"] + listing[1:]).splitlines()
        for symbol, readable in zip(mangled, demangled):
            for name in qualified_names:
                if f" c10d::{name}(" in readable:
                    found[name] = (symbol.split()[-1], library.name)
    missing = [n for n in qualified_names if n not in found]
    if missing:
        raise CallersError(
            f"no library in {lib_dir} defines {', '.join('c10d::' + n for n in missing)}"
        )
    return found


def call_sites(
    lib_dir: pathlib.Path, symbols: Dict[str, str]
) -> Dict[str, List[CallSite]]:
    """Every call of each symbol in the libraries of ``lib_dir``, with the function it lies in.

    ``symbols`` maps each symbol to the library that defines it, which is always searched;
    each library is disassembled once, for all of them.
    """
    sites: Dict[str, List[CallSite]] = {symbol: [] for symbol in symbols}
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
        if not wanted:
            continue
        targets = {
            s: re.compile(rf"\s(call|jmp)\s.*<{re.escape(s)}(@plt|\.localalias)?>")
            for s in wanted
        }
        callers: Dict[str, List[str]] = {s: [] for s in wanted}
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
                    if (
                        symbol in line
                        and targets[symbol].search(line)
                        and current.split("@")[0].split(".")[0] != symbol
                    ):
                        callers[symbol].append(current)
        if objdump.returncode != 0:
            raise CallersError(
                f"objdump -d {library} failed with exit code {objdump.returncode}"
            )
        for symbol in wanted:
            sites[symbol] += [
                CallSite(library.name, caller) for caller in _demangle(callers[symbol])
            ]
    return sites


def unsound_replacements(
    lib_dir: pathlib.Path, qualified_names: Sequence[str]
) -> Dict[str, List[CallSite]]:
    """For each function, the call sites other than its binding; empty lists where replacing it is sound.

    Raises CallersError when binutils is missing, or no library defines a function.
    """
    missing_tools = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing_tools:
        raise CallersError(
            f"{', '.join(missing_tools)} not found: install binutils (apt-get install binutils)"
        )
    symbols = symbols_of(lib_dir, qualified_names)
    found = call_sites(lib_dir, dict(symbols.values()))
    unsound: Dict[str, List[CallSite]] = {}
    for name, (symbol, _) in symbols.items():
        sites = found[symbol]
        if not sites:
            sites = [CallSite("", "no call site was found, not even its binding's")]
        unsound[name] = [s for s in sites if not s.is_binding]
    return unsound
