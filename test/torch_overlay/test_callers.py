"""Who calls a function of libtorch, with stand-in binutils."""

import os

import pytest

from torch_overlay import callers


def fake_binutils(tmp_path, monkeypatch, call_from):
    """nm, readelf and objdump that show c10d::Reducer::f defined in libtorch_cpu.so and called from ``call_from``."""
    bin_dir = tmp_path / "bin"
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libtorch_cpu.so").write_text("")
    (lib / "libtorch_python.so").write_text("")
    scripts = {
        "nm": """[ "$1" = -C ] && echo "0000 T c10d::Reducer::f()" || echo "0000 T _ZN4c10d7Reducer1fEv" """,
        "readelf": """case "$2" in *python*) echo "0 0 R_X86_64_JUMP_SLOT 0 _ZN4c10d7Reducer1fEv + 0";; esac""",
        "objdump": (
            "printf '0000 <_ZN4c10d7Reducer1fEv@plt>:\\n 10:\\tjmp *0x1(%%rip)\\n"
            f"0100 <{call_from}>:\\n 110:\\tcall 10 <_ZN4c10d7Reducer1fEv@plt>\\n'"
        ),
    }
    bin_dir.mkdir()
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return lib


def test_replacing_a_function_that_libtorch_calls_is_refused(tmp_path, monkeypatch):
    lib = fake_binutils(tmp_path, monkeypatch, "_ZN4c10d7Reducer17finalize_backwardEv")
    found = callers.unsound_replacements(lib, ["Reducer::f"])
    assert [(s.library, s.caller) for s in found["Reducer::f"]] == [
        ("libtorch_python.so", "c10d::Reducer::finalize_backward()")
    ]


def test_a_function_only_its_binding_calls_can_be_replaced(tmp_path, monkeypatch):
    # What c++filt makes of the dispatcher of init.cpp's binding, as in the torch 2.11.0 wheel.
    dispatcher = (
        "pybind11::cpp_function::initialize<torch::distributed::c10d::(anonymous namespace)::c10d_init"
        "(_object*, _object*)::{lambda(c10d::Reducer&)#5}, void, c10d::Reducer&>"
    )
    assert callers.CallSite("libtorch_python.so", dispatcher).is_binding
    # And of the callback that calls it, as in the torch 2.14.1 wheel.
    callback = (
        "void pybind11::detail::function_ref<void (c10d::Reducer&)>::callback_fn<torch::distributed::"
        "c10d::(anonymous namespace)::c10d_init(_object*, _object*)::{lambda(c10d::Reducer&)#5}>"
        "(long, c10d::Reducer&)"
    )
    assert callers.CallSite("libtorch_python.so", callback).is_binding
    # A lambda of c10d_init that binds no Reducer method is not the binding.
    other = callback.replace("{lambda(c10d::Reducer&)#5}", "{lambda(c10d::Logger&)#2}")
    assert not callers.CallSite("libtorch_python.so", other).is_binding
    lib = fake_binutils(tmp_path, monkeypatch, "_Z4mainv")
    assert [
        s.caller
        for s in callers.unsound_replacements(lib, ["Reducer::f"])["Reducer::f"]
    ] == ["main()"]
    with pytest.raises(
        callers.CallersError, match="no library in .* defines c10d::Reducer::g"
    ):
        callers.unsound_replacements(lib, ["Reducer::g"])


def test_a_function_nothing_is_seen_calling_is_not_replaced(tmp_path, monkeypatch):
    # Not even its binding: it is called in a way the check cannot see.
    lib = fake_binutils(tmp_path, monkeypatch, "_Z4mainv")
    (tmp_path / "bin" / "objdump").write_text("#!/bin/sh\necho '0100 <_Z4mainv>:'\n")
    found = callers.unsound_replacements(lib, ["Reducer::f"])
    assert [s.caller for s in found["Reducer::f"]] == [
        "no call site was found, not even its binding's"
    ]
