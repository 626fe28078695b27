"""Who refers to a function of libtorch, and how: with stand-in binutils, and in the wheel itself."""

import os
import pathlib

import pytest

from torch_overlay import callers

SYMBOL = "_ZN4c10d7Reducer1fEv"


def fake_binutils(tmp_path, monkeypatch, disassembly):
    """nm, readelf and objdump that show c10d::Reducer::f defined in libtorch_cpu.so,
    referred to from libtorch_python.so by the lines of ``disassembly``."""
    bin_dir = tmp_path / "bin"
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libtorch_cpu.so").write_text("")
    (lib / "libtorch_python.so").write_text("")
    listing = "\\n".join(disassembly).replace("%", "%%")
    scripts = {
        "nm": f"""case "$*" in *cpu*) [ "$1" = -C ] && echo "0000 T c10d::Reducer::f()" || echo "0000 T {SYMBOL}";; esac""",
        "readelf": f"""case "$2" in *python*) echo "0 0 R_X86_64_JUMP_SLOT 0 {SYMBOL} + 0";; esac""",
        "objdump": f"""case "$3" in *python*) printf '{listing}\\n';; esac""",
    }
    bin_dir.mkdir()
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return lib


def caller(name, *instructions):
    return [f"0100 <{name}>:", *(f" 110:\t{i}" for i in instructions)]


def test_a_call_through_the_plt_is_redirected(tmp_path, monkeypatch):
    lib = fake_binutils(
        tmp_path,
        monkeypatch,
        [f"0000 <{SYMBOL}@plt>:", " 10:\tjmp *0x1(%rip)"]
        + caller("_Z4mainv", f"call 10 <{SYMBOL}@plt>"),
    )
    found = callers.find_references(lib, {SYMBOL: "libtorch_cpu.so"})[SYMBOL]
    assert [(r.referrer, r.through_relocation) for r in found] == [("main()", True)]
    assert callers.find_unsound_redirects(lib, [SYMBOL]) == {SYMBOL: []}


@pytest.mark.parametrize(
    "instruction",
    [
        f"call 10 <{SYMBOL}>",
        f"jmp 10 <{SYMBOL}.localalias>",
        f"lea 0x10(%rip),%rax        # 10 <{SYMBOL}>",
    ],
    ids=["direct call", "local alias", "address taken"],
)
def test_a_reference_no_relocation_carries_is_refused(
    tmp_path, monkeypatch, instruction
):
    lib = fake_binutils(tmp_path, monkeypatch, caller("_Z4mainv", instruction))
    [unsound] = callers.find_unsound_redirects(lib, [SYMBOL])[SYMBOL]
    assert unsound.describe() == "main() in libtorch_python.so (refers to it directly)"


def test_a_function_only_its_binding_calls_can_be_carried_by_it(tmp_path, monkeypatch):
    # What c++filt makes of the dispatcher of init.cpp's binding, as in the torch 2.11.0 wheel.
    dispatcher = (
        "pybind11::cpp_function::initialize<torch::distributed::c10d::(anonymous namespace)::c10d_init"
        "(_object*, _object*)::{lambda(c10d::Reducer&)#5}, void, c10d::Reducer&>"
    )
    assert callers.Reference("libtorch_python.so", dispatcher, True).is_binding
    # And of the callback that calls it, as in the torch 2.14.1 wheel.
    callback = (
        "void pybind11::detail::function_ref<void (c10d::Reducer&)>::callback_fn<torch::distributed::"
        "c10d::(anonymous namespace)::c10d_init(_object*, _object*)::{lambda(c10d::Reducer&)#5}>"
        "(long, c10d::Reducer&)"
    )
    assert callers.Reference("libtorch_python.so", callback, True).is_binding
    # A lambda of c10d_init that binds no Reducer method is not the binding.
    other = callback.replace("{lambda(c10d::Reducer&)#5}", "{lambda(c10d::Logger&)#2}")
    assert not callers.Reference("libtorch_python.so", other, True).is_binding
    lib = fake_binutils(
        tmp_path, monkeypatch, caller("_Z4mainv", f"call 10 <{SYMBOL}@plt>")
    )
    assert [
        r.referrer
        for r in callers.find_unsound_binding_replacements(lib, [SYMBOL])[SYMBOL]
    ] == ["main()"]
    with pytest.raises(callers.CallersError, match="no library in .* defines _Z1gv"):
        callers.find_unsound_binding_replacements(lib, ["_Z1gv"])


def test_a_function_nothing_is_seen_calling_is_not_carried_by_its_binding(
    tmp_path, monkeypatch
):
    # Not even its binding: it is called in a way the check cannot see.
    lib = fake_binutils(tmp_path, monkeypatch, caller("_Z4mainv"))
    found = callers.find_unsound_binding_replacements(lib, [SYMBOL])
    assert [r.referrer for r in found[SYMBOL]] == [
        "no call site was found, not even its binding's"
    ]


def test_definitions_are_found_by_a_part_of_their_demangled_name(tmp_path, monkeypatch):
    lib = fake_binutils(tmp_path, monkeypatch, [])
    assert callers.find_definitions(lib, "::Reducer::f(") == [
        (SYMBOL, "c10d::Reducer::f()", "libtorch_cpu.so")
    ]
    assert callers.find_definitions(lib, "::Reducer::g(") == []


def test_libtorch_calls_finalize_backward_through_its_plt():
    # The fact that carrying a change to finalize_backward() rests on, checked in the
    # wheel at hand rather than assumed: the autograd engine's callback, queued by
    # mark_variable_ready(), and delay_all_reduce() call it through libtorch_cpu's PLT.
    try:
        import torch
    except ImportError:
        pytest.skip(
            "torch is not installed in this interpreter: run under scripts/test"
        )
    lib = pathlib.Path(torch.__file__).parent / "lib"
    [(symbol, _, library)] = callers.find_definitions(
        lib, "c10d::Reducer::finalize_backward("
    )
    found = callers.find_references(lib, {symbol: library})[symbol]
    assert found and all(r.through_relocation for r in found), found
    assert any("mark_variable_ready" in r.referrer for r in found)
    assert callers.find_unsound_redirects(lib, [symbol]) == {symbol: []}
