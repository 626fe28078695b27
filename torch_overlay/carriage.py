"""Decide how each change to libtorch's own code is carried, and check that it is sound.

Every function of libtorch that the series changes, every function that gains
a prologue and the destructor of every class that gains a data member is
carried through the relocations that refer to it (redirect.cpp), except a
changed function whose signature the series changes: that one is carried
through its Python binding. :mod:`torch_overlay.callers` tells, from the
wheel's libraries, whether each way reaches every caller; the answer depends
only on the wheel and the symbols, so callers.py keeps it in the overlay's cache.
"""

import dataclasses
import pathlib
import subprocess
from typing import List, Sequence

from torch_overlay import callers, codegen
from torch_overlay.cpp_classes import AddedMember
from torch_overlay.reporting import OverlayError, progress
from torch_overlay.series import Series
from torch_overlay.wheel import Torch

RENAMED_PREFIX = "_overlay_replaced_"


@dataclasses.dataclass(frozen=True)
class Carriage:
    """The symbols of libtorch that the extension redirects, and those it carries through a binding."""

    redirected: List[str]
    through_binding: List[str]


def find_stock_symbol(renamed: str) -> str:
    """Return libtorch's name of the function that the extension compiled as ``renamed``.

    _ZN4c10d7Reducer29_overlay_replaced_reset_stateEv names
    c10d::Reducer::reset_state() as _ZN4c10d7Reducer11reset_stateEv (the same
    derivation as redirect.cpp's).
    """
    at = renamed.index(RENAMED_PREFIX)
    digits = at
    while digits > 0 and renamed[digits - 1].isdigit():
        digits -= 1
    length = int(renamed[digits:at])
    name = renamed[at + len(RENAMED_PREFIX) : at + length]
    return renamed[:digits] + str(len(name)) + name + renamed[at + length :]


def decide_carriage(
    built: pathlib.Path,
    lib_dir: pathlib.Path,
    series: Series,
    members: Sequence[AddedMember],
    prologues: Sequence[codegen.PrologueTarget],
) -> Carriage:
    """Return how the extension at ``built`` carries each change to libtorch.

    A changed function is redirected where libtorch defines the symbol that
    its renamed definition derives from and its first line (its return type)
    is unchanged; otherwise its binding carries it, as redirect.cpp decides.
    """
    redirected = [t.symbol for t in prologues] + [
        codegen.mangle_destructor(owner, variant)
        for owner in dict.fromkeys(m.member.owner for m in members)
        for variant in ("D1", "D2")
    ]
    through_binding: List[str] = []
    if series.replaced:
        listing = subprocess.run(
            ["nm", "-D", "--defined-only", str(built)],
            capture_output=True,
            text=True,
        )
        if listing.returncode != 0:
            raise OverlayError(f"nm cannot read {built}: {listing.stderr.strip()}")
        renamed = {
            line.split()[-1]
            for line in listing.stdout.splitlines()
            if RENAMED_PREFIX in line
        }
        defined: set[str] = set()
        for library in sorted(lib_dir.glob("libtorch*.so")):
            listing = subprocess.run(
                ["nm", "-D", "--defined-only", str(library)],
                capture_output=True,
                text=True,
                check=True,
            )
            defined.update(line.split()[-1] for line in listing.stdout.splitlines())
        for function in series.replaced:
            mine = [s for s in renamed if f"{RENAMED_PREFIX}{function.member}E" in s]
            if len(mine) != 1:
                raise OverlayError(
                    f"the extension does not define {function.name} under its renamed "
                    f"name once ({sorted(mine)})"
                )
            stock = find_stock_symbol(mine[0])
            if stock in defined and function.lines[0].patch is None:
                redirected.append(stock)
                continue
            # The signature changed: the binding is what reaches the new one, and
            # libtorch's old one must have no caller but that binding.
            named = f"{len(function.member)}{function.member}E"
            prefix = stock[: stock.index(named) + len(named)]
            through_binding += sorted(s for s in defined if s.startswith(prefix))
    return Carriage(redirected=redirected, through_binding=through_binding)


def check_carriage(torch: Torch, carriage: Carriage) -> None:
    """Raise OverlayError unless each way of carrying a change reaches every caller in the wheel."""
    if not carriage.redirected and not carriage.through_binding:
        return
    progress(
        f"checking how the wheel's libraries refer to the {len(carriage.redirected)} "
        f"redirected and {len(carriage.through_binding)} rebound function(s) (a few "
        "minutes, once per wheel)"
    )
    lib_dir = torch.site_packages / "torch" / "lib"
    try:
        found = {
            **callers.find_unsound_redirects(lib_dir, carriage.redirected),
            **callers.find_unsound_binding_replacements(
                lib_dir, carriage.through_binding
            ),
        }
    except callers.CallersError as e:
        raise OverlayError(
            f"cannot check who calls the functions the overlay carries: {e}"
        ) from e
    unsound = {
        symbol: [r.describe() for r in references]
        for symbol, references in found.items()
        if references
    }
    if unsound:
        details = "; ".join(
            f"{symbol}: {', '.join(references)}"
            for symbol, references in unsound.items()
        )
        raise OverlayError(
            "the overlay cannot reach every caller of functions that the series changes: "
            "a redirected function is referred to other than through a relocation, or one "
            "whose signature changed is called other than through its binding, so those "
            f"callers would stay on libtorch's code: {details}"
        )
