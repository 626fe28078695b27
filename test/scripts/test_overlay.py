"""The overlay's own logic: reading the series, and installing it into a stand-in site-packages.

The stand-in holds the wheel's real base files (taken from the venv's torch, or
from the overlay's backups when it is installed there) and a RECORD for them;
only the compiler is replaced, so these tests run in seconds. That test/ and
bindings.cpp agree with the series is the patch series linter's job (test_lint.py).
"""

import dataclasses
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from conftest import BASE, fake_command, WHEEL_ORIGINALS
from torch_overlay import bases, callers, commits, install as overlay, series

REPO = pathlib.Path(__file__).resolve().parents[2]
PATCHES = BASE.patches(REPO)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


ORIGINALS = WHEEL_ORIGINALS


@pytest.fixture
def site(tmp_path):
    site = tmp_path / "site-packages"
    for installed, data in ORIGINALS.items():
        (site / installed).parent.mkdir(parents=True, exist_ok=True)
        (site / installed).write_bytes(data)
    return site


@pytest.fixture
def torch_dist(site):
    return overlay.Torch(
        "2.1.2", site, {installed: sha(data) for installed, data in ORIGINALS.items()}
    )


@pytest.fixture
def repo(tmp_path):
    """A copy of the repository's patches, to change without touching the real ones."""
    copy = tmp_path / "repo"
    shutil.copytree(PATCHES, BASE.patches(copy))
    return copy


class FakeBuild:
    """Stands in for the compiler: records calls, writes a placeholder module."""

    def __init__(self, error=None):
        self.calls = 0
        self.error = error

    def __call__(self, include, patches):
        self.calls += 1
        assert (include / "torch/csrc/distributed/c10d/reducer.hpp").is_file()
        if self.error:
            raise self.error
        built = include.parent / "_C.cpython-311-x86_64-linux-gnu.so"
        built.write_bytes(b"placeholder")
        return built


def site_state(site):
    return {
        str(p.relative_to(site)): sha(p.read_bytes())
        for p in sorted(site.rglob("*"))
        if p.is_file()
    }


# The series


def test_series_roles(site):
    s = series.read_series(PATCHES, site)
    assert sorted(series.installed_path(p) for p in s.applied) == sorted(ORIGINALS)
    assert s.fragments and {f.path for f in s.fragments} == set(series.COMPILED)
    assert "bool Reducer::reset_state() {" in "".join(f.text for f in s.fragments)


def make_patch(tmp_path, path, before, *afters, extra=()):
    """A real ``git format-patch`` series that changes ``path`` from ``before`` to each of ``afters`` in turn."""
    work = tmp_path / "scratch"
    work.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(git + ["init", "-q"], cwd=work, check=True)
    (work / path).parent.mkdir(parents=True, exist_ok=True)
    (work / path).write_text(before)
    subprocess.run(git + ["add", "-A"], cwd=work, check=True)
    subprocess.run(git + ["commit", "-qm", "base"], cwd=work, check=True)
    for n, after in enumerate(afters):
        (work / path).write_text(after)
        subprocess.run(git + ["commit", "-qam", f"change {n}"], cwd=work, check=True)
    out = tmp_path / "patches"
    subprocess.run(
        git + ["format-patch", "-q", *extra, f"-{len(afters)}", "-o", str(out)],
        cwd=work,
        check=True,
    )
    return out


def test_removing_reducer_cpp_lines_is_refused(tmp_path, site):
    patches = make_patch(tmp_path, series.REDUCER_CPP, "a\nb\nc\n", "a\nc\nd\n")
    with pytest.raises(
        series.SeriesError,
        match="removes line 2, a line of the base file.*keep C\\+\\+ changes additive",
    ):
        series.read_series(patches, site)


BASE_LINES = "".join(f"base {n}\n" for n in range(1, 21))


def test_later_patch_may_change_what_an_earlier_one_added(tmp_path, site):
    first = BASE_LINES.replace("base 10\n", "base 10\nvoid f() {\n  old();\n}\n")
    second = first.replace("  old();\n", "  new_a();\n  new_b();\n").replace(
        "base 2\n", "base 2\nint g;\n"
    )
    s = series.read_series(
        make_patch(tmp_path, series.LOGGER_CPP, BASE_LINES, first, second), site
    )
    assert [(f.patch[:4], f.first_line, f.text) for f in s.fragments] == [
        ("0002", 3, "int g;\n"),
        ("0001", 12, "void f() {\n"),
        ("0002", 13, "  new_a();\n  new_b();\n"),
        ("0001", 15, "}\n"),
    ]


def test_later_patch_removing_a_base_line_is_refused(tmp_path, site):
    first = BASE_LINES.replace("base 10\n", "base 10\nvoid f() {}\n")
    second = first.replace("base 11\n", "")
    with pytest.raises(
        series.SeriesError, match="0002.*removes line 12, a line of the base file"
    ):
        series.read_series(
            make_patch(tmp_path, series.REDUCER_CPP, BASE_LINES, first, second), site
        )


def test_file_the_overlay_cannot_carry_is_refused(tmp_path, site):
    patches = make_patch(
        tmp_path, "torch/csrc/distributed/c10d/ProcessGroup.cpp", "a\n", "b\n"
    )
    with pytest.raises(
        series.SeriesError, match="ProcessGroup.cpp, which the wheel does not ship"
    ):
        series.read_series(patches, site)


def test_additions_source_points_into_reducer_cpp(site):
    source = overlay.additions_source(series.read_series(PATCHES, site))
    assert '#include "reducer_prelude.h"' in source
    assert re.search(r'#line \d+ "torch/csrc/distributed/c10d/reducer.cpp"', source)


# A series on a base whose libtorch has the functions it changes (v2.14.1)

BASE_CPP = "".join(f"int base_{n};\n" for n in range(1, 11)) + (
    "void Reducer::f(\n    int a) {\n  old_a();\n  old_b();\n  old_c();\n  old_d();\n  old_e();\n}\n"
    + "".join(f"int tail_{n};\n" for n in range(1, 11))
)
CHANGED_CPP = BASE_CPP.replace("void Reducer::f(", "bool Reducer::f(").replace(
    "  old_c();\n", "  new_c();\n  return true;\n"
)


def test_changed_function_is_replaced_whole(tmp_path, site):
    added = CHANGED_CPP.replace(
        "int tail_1;\n", "void Reducer::g() {\n  new_g();\n}\nint tail_1;\n"
    )
    patches = make_patch(
        tmp_path, series.REDUCER_CPP, BASE_CPP, added, extra=["--function-context"]
    )
    s = series.read_series(patches, site, replaceable=True)
    assert [(r.name, r.first_line, r.binding, r.symbol) for r in s.replaced] == [
        ("Reducer::f", 11, "_f", "_overlay_replaced_f")
    ]
    assert (
        s.replaced[0].text
        == CHANGED_CPP[
            CHANGED_CPP.index("bool Reducer::f(") : CHANGED_CPP.index("int tail_1")
        ]
    )
    assert [f.text for f in s.fragments] == ["void Reducer::g() {\n  new_g();\n}\n"]
    source = overlay.additions_source(s)
    assert "// replaces c10d::Reducer::f\n#line 11" in source and "new_c();" in source


def test_changed_function_not_shown_whole_is_refused(tmp_path, site):
    patches = make_patch(
        tmp_path,
        series.REDUCER_CPP,
        BASE_CPP,
        CHANGED_CPP.replace("bool Reducer", "void Reducer"),
    )
    with pytest.raises(
        series.SeriesError, match="without showing all of it.*--function-context"
    ):
        series.read_series(patches, site, replaceable=True)


def test_changed_function_is_refused_on_an_additive_base(tmp_path, site):
    patches = make_patch(
        tmp_path,
        series.REDUCER_CPP,
        BASE_CPP,
        CHANGED_CPP,
        extra=["--function-context"],
    )
    with pytest.raises(
        series.SeriesError,
        match="removes line 11, a line of the base file.*keep C\\+\\+ changes additive",
    ):
        series.read_series(patches, site)


def test_added_constant_comes_before_the_functions(tmp_path, site):
    constant = 'constexpr const char* kNote =\n    "a note";\n'
    added = CHANGED_CPP.replace(
        "int tail_1;\n",
        f"{constant}void Reducer::g() {{\n  use(kNote);\n}}\nint tail_1;\n",
    )
    patches = make_patch(
        tmp_path, series.REDUCER_CPP, BASE_CPP, added, extra=["--function-context"]
    )
    s = series.read_series(patches, site, replaceable=True)
    assert [(f.declaration, f.text) for f in s.fragments] == [
        (True, constant),
        (False, "void Reducer::g() {\n  use(kNote);\n}\n"),
    ]
    source = overlay.additions_source(s)
    assert (
        source.index("kNote =")
        < source.index("// replaces c10d::Reducer::f")
        < source.index("use(kNote)")
    )


INIT_BASE = (
    "".join(f"int line_{n};\n" for n in range(1, 11))
    + (
        '          .def(\n              "_f",\n              &::c10d::Reducer::f,\n'
        "              py::call_guard<py::gil_scoped_release>())\n"
    )
    + "".join(f"int tail_{n};\n" for n in range(1, 11))
)


def test_init_cpp_may_change_only_the_binding_of_a_replaced_function(tmp_path, site):
    # Reducer::f stays libtorch's here, so its binding cannot change; the v2.14.1
    # series changes that of reset_state(), which it replaces (test_v2_14_series_roles).
    changed = INIT_BASE.replace(
        "              &::c10d::Reducer::f,\n",
        '              [](::c10d::Reducer& reducer, int a) { reducer.f(a); },\n              py::arg("a"),\n',
    )
    patches = make_patch(tmp_path, series.INIT_CPP, INIT_BASE, changed)
    with pytest.raises(
        series.SeriesError,
        match="changes the init.cpp bindings _f, which bind no function",
    ):
        series.read_series(patches, site, replaceable=True)


def test_init_cpp_may_not_change_lines_outside_a_binding(tmp_path, site):
    patches = make_patch(
        tmp_path, series.INIT_CPP, INIT_BASE, INIT_BASE.replace("int line_9;\n", "")
    )
    with pytest.raises(
        series.SeriesError,
        match="removes line 9, a line of the base file, outside a binding",
    ):
        series.read_series(patches, site, replaceable=True)


def test_v2_14_series_roles(tmp_path):
    # The files the v2.14.1 wheel ships, as placeholders: roles depend only on which exist.
    site = tmp_path / "site-packages"
    hooks = "torch/distributed/algorithms/ddp_comm_hooks/"
    for path in (
        "torch/nn/parallel/distributed.py",
        "torch/distributed/distributed_c10d.py",
        "torch/_C/_distributed_c10d.pyi",
        "torch/testing/_internal/distributed/distributed_test.py",
        "torch/distributed/algorithms/join.py",
        *(
            hooks + name
            for name in (
                "ddp_zero_hook.py",
                "mixed_precision_hooks.py",
                "optimizer_overlap_hooks.py",
                "post_localSGD_hook.py",
                "powerSGD_hook.py",
            )
        ),
    ):
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text("")
    for header in ("reducer.hpp", "logger.hpp"):
        (site / "torch/include/torch/csrc/distributed/c10d" / header).parent.mkdir(
            parents=True, exist_ok=True
        )
        (site / "torch/include/torch/csrc/distributed/c10d" / header).write_text("")
    upstream = bases.get("v2.14.1")
    s = series.read_series(upstream.patches(REPO), site, replaceable=True)
    assert [r.name for r in s.replaced] == [
        "Reducer::update_process_group",
        "Reducer::reset_state",
    ]
    # 0008 gives reset_state() a parameter, and its binding in init.cpp an argument:
    # a changed binding of a replaced function; 0026 has it return whether it abandoned a pass.
    assert s.replaced[1].text.startswith("bool Reducer::reset_state(bool keep_armed) {")
    assert sorted(s.bound_methods) == [
        "_next_iteration_records_static_graph",
        "_remove_comm_hook",
        "_set_process_group_data",
    ]
    added = "".join(f.text for f in s.fragments)
    assert "void Reducer::sync_bucket_assignment(" in added
    # A namespace-scope constant comes first, before the functions that use it.
    assert s.fragments[0].declaration and s.fragments[0].text.startswith(
        "constexpr const char* kKeepsPreviousGroup"
    )
    assert "torch/testing/_internal/distributed/distributed_test.py" in s.applied
    # 0023 counts reconfigures in c10d's Python front end, which the wheel ships.
    assert "torch/distributed/distributed_c10d.py" in s.applied
    # 0011 and 0025: the hook modules implement the protocol that DDP calls.
    assert hooks + "powerSGD_hook.py" in s.applied
    # Its fixes alone: the first patches, which change the two functions and bind nothing new.
    fixes = series.read_series(
        upstream.patches(REPO),
        site,
        replaceable=True,
        count=len(upstream.fix_patches(REPO)),
    )
    assert [p.name[:4] for p in fixes.patches] == [
        "0001",
        "0002",
        "0003",
        "0004",
        "0005",
        "0006",
    ]
    assert [r.name for r in fixes.replaced] == [
        "Reducer::update_process_group",
        "Reducer::reset_state",
    ]
    assert fixes.replaced[1].text.startswith("void Reducer::reset_state() {")
    assert fixes.bound_methods == []


@pytest.mark.parametrize(
    "version, message",
    [
        ("2.14.1", None),
        ("2.11.0+cu130", None),
        ("2.13.0", "apply to torch 2.14.x, 2.11.x, not to torch 2.13.0"),
    ],
)
def test_the_fixes_alone_go_onto_more_releases(version, message):
    upstream = bases.get("v2.14.1")
    if message is None:
        upstream.check_fixes(version)
    else:
        with pytest.raises(bases.UnsupportedTorch, match=message):
            upstream.check_fixes(version)
    with pytest.raises(bases.UnsupportedTorch, match="marks no patches as fixes"):
        bases.get("v2.1.2").check_fixes("2.1.2")


def test_the_last_fix_is_named_by_a_subject_of_the_series():
    upstream = bases.get("v2.14.1")
    assert commits.read_subject(upstream.fix_patches(REPO)[-1]) == upstream.last_fix
    renamed = dataclasses.replace(upstream, last_fix=upstream.last_fix + " again")
    with pytest.raises(
        bases.UnsupportedTorch, match="last fix: no patch in .* the closest is"
    ):
        renamed.fix_patches(REPO)


def test_renames_reach_only_the_replaced_functions(tmp_path, site):
    include = tmp_path / "include"
    for header, includes in (
        ("reducer.hpp", "#include <mutex>\n#include <c10/core/ScalarType.h>\n"),
        ("logger.hpp", "#include <torch/csrc/distributed/c10d/reducer.hpp>\n"),
    ):
        (include / "torch/csrc/distributed/c10d" / header).parent.mkdir(
            parents=True, exist_ok=True
        )
        (include / "torch/csrc/distributed/c10d" / header).write_text(
            includes + "class X {};\n"
        )
    patches = make_patch(
        tmp_path,
        series.REDUCER_CPP,
        BASE_CPP,
        CHANGED_CPP,
        extra=["--function-context"],
    )
    header = overlay.renames_source(
        series.read_series(patches, site, replaceable=True), include
    )
    # What the two headers include comes before the rename, and not the headers themselves;
    # then the binding of the replaced function is switched on.
    assert header.splitlines()[-4:] == [
        "#include <mutex>",
        "#include <c10/core/ScalarType.h>",
        "#define f _overlay_replaced_f",
        "#define TORCH_OVERLAY_BIND_F",
    ]
    # The v2.1.2 series renames nothing, and switches on the bindings its init.cpp hunks add.
    source = overlay.renames_source(series.read_series(PATCHES, site), include)
    defines = [line for line in source.splitlines() if "#define" in line]
    assert defines == [
        "#define TORCH_OVERLAY_BIND_BACKWARD_PASS_UNFINISHED",
        "#define TORCH_OVERLAY_BIND_REMOVE_COMM_HOOK",
        "#define TORCH_OVERLAY_BIND_RESET_STATE",
        "#define TORCH_OVERLAY_BIND_SET_PROCESS_GROUP_DATA",
        "#define TORCH_OVERLAY_BIND_UPDATE_PROCESS_GROUP",
    ]


def test_every_binding_is_switched_by_its_macro():
    text = (REPO / "torch_overlay" / "bindings.cpp").read_text()
    for block in text.split("#ifdef ")[1:]:
        macro, body = block.split("\n", 1)
        names = re.findall(r'py::name\("(\w+)"\)', body.split("#endif", 1)[0])
        assert [overlay.binding_macro(n) for n in names] == [macro]
    assert len(re.findall(r"py::name\(\"", text)) == text.count("#ifdef ")


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
    for name, body in scripts.items():
        fake_command(bin_dir, name, body)
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


@pytest.mark.parametrize(
    "base, version, message",
    [
        (
            "v2.1.2",
            "2.2.0",
            "has DistributedDataParallel._update_process_group upstream.*--base v2.14.1",
        ),
        (
            "v2.1.2",
            "2.13.0",
            "has DistributedDataParallel._update_process_group upstream",
        ),
        ("v2.1.2", "2.14.0", "that is the base v2.14.1: pass --base v2.14.1"),
        ("v2.1.2", "2.0.1", "needs torch 2.1.x"),
        ("v2.14.1", "2.1.2", "needs torch 2.14.x; that is the base v2.1.2"),
        ("v2.14.1", "2.13.0", "needs torch 2.14.x; install torch==2.14.1"),
        ("v2.1.2", "nonsense", "cannot read a torch version"),
    ],
)
def test_unsupported_torch_versions(base, version, message):
    with pytest.raises(bases.UnsupportedTorch, match=message):
        bases.get(base).check(version)


@pytest.mark.parametrize(
    "base, version",
    [
        ("v2.1.2", "2.1.0"),
        ("v2.1.2", "2.1.2"),
        ("v2.1.2", "2.1.2+cpu"),
        ("v2.14.1", "2.14.1+cu130"),
    ],
)
def test_supported_torch_versions(base, version):
    bases.get(base).check(version)


def test_unknown_base():
    with pytest.raises(
        bases.UnsupportedTorch,
        match="no series for the base 'v9'; the bases are v2.1.2, v2.14.1",
    ):
        bases.get("v9")


# Installing into a stand-in site-packages


def test_install_status_uninstall(repo, site, torch_dist, capsys):
    build = FakeBuild()
    overlay.install(repo, torch_dist, BASE, build)
    assert build.calls == 1
    distributed = (site / "torch/nn/parallel/distributed.py").read_text()
    assert "    def _update_process_group(\n" in distributed
    assert (
        "bool reset_state();"
        in (site / "torch/include/torch/csrc/distributed/c10d/reducer.hpp").read_text()
    )
    assert (
        site / (overlay.PACKAGE + ".pth")
    ).read_text() == f"import {overlay.PACKAGE}\n"
    # Without the .pth file's start-up hook, distributed.py loads the extension itself.
    assert distributed.endswith(overlay.load_extension_source(torch_dist.version))
    assert overlay.status(repo, torch_dist, BASE) == 0

    overlay.install(repo, torch_dist, BASE, build)
    assert build.calls == 1, "an up-to-date install rebuilt"
    assert "already installed and up to date" in capsys.readouterr().out

    overlay.uninstall(torch_dist)
    for installed, data in ORIGINALS.items():
        assert (site / installed).read_bytes() == data
    assert not (site / overlay.PACKAGE).exists()
    assert not (site / (overlay.PACKAGE + ".pth")).exists()
    assert overlay.status(repo, torch_dist, BASE) == 1


def test_a_missing_extension_says_how_to_recover():
    # The package gone, the patched distributed.py still there.
    code = overlay.load_extension_source("2.1.2+cu121").replace(
        overlay.PACKAGE, "_no_such_overlay_package"
    )
    with pytest.raises(ImportError) as caught:
        exec(compile(code, "distributed.py", "exec"), {})
    message = str(caught.value)
    assert "scripts/overlay install" in message
    assert "pip install --force-reinstall --no-deps torch==2.1.2" in message


def test_the_installed_overlay_loads_without_start_up_hooks(tmp_path):
    # python -S skips the .pth file; DDP must not run on the stock Reducer then.
    try:
        import torch
    except ImportError:
        pytest.skip(
            "torch is not installed in this interpreter: run under scripts/test"
        )
    site = pathlib.Path(torch.__file__).parents[1]
    if not (site / (overlay.PACKAGE + ".pth")).is_file():
        pytest.skip(
            "the overlay is not installed in this interpreter: run under scripts/test"
        )
    env = dict(os.environ, PYTHONPATH=str(site))
    loaded = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            f"import sys; assert sys.flags.no_site and '{overlay.PACKAGE}' not in sys.modules; "
            f"import torch; print('{overlay.PACKAGE}._C' in sys.modules)",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == "True"


def test_install_rebuilds_when_patches_change(repo, site, torch_dist):
    build = FakeBuild()
    overlay.install(repo, torch_dist, BASE, build)
    patch = sorted(BASE.patches(repo).glob("*.patch"))[1]
    patch.write_text(
        patch.read_text().replace(
            "Swap the process group", "Replace the process group", 1
        )
    )
    assert overlay.status(repo, torch_dist, BASE) == 2
    overlay.install(repo, torch_dist, BASE, build)
    assert build.calls == 2
    assert overlay.status(repo, torch_dist, BASE) == 0
    overlay.uninstall(torch_dist)
    for installed, data in ORIGINALS.items():
        assert (site / installed).read_bytes() == data


def test_a_shorter_series_leaves_no_file_patched_that_it_does_not_patch(
    repo, site, torch_dist
):
    # As scripts/mutants and a run at one commit of the stack install one.
    build = FakeBuild()
    overlay.install(repo, torch_dist, BASE, build)
    for patch in sorted(BASE.patches(repo).glob("*.patch"))[1:]:
        patch.unlink()
    overlay.install(repo, torch_dist, BASE, build)
    distributed = "torch/nn/parallel/distributed.py"
    assert (site / distributed).read_bytes() == ORIGINALS[distributed]
    assert distributed not in overlay.Manifest.read(site).files
    assert overlay.status(repo, torch_dist, BASE) == 0
    overlay.uninstall(torch_dist)
    for installed, data in ORIGINALS.items():
        assert (site / installed).read_bytes() == data


def test_status_notices_a_file_changed_behind_its_back(repo, site, torch_dist):
    overlay.install(repo, torch_dist, BASE, FakeBuild())
    with open(site / "torch/nn/parallel/distributed.py", "a") as f:
        f.write("# edited\n")
    assert overlay.status(repo, torch_dist, BASE) == 2


@pytest.mark.parametrize("version", ["2.2.0", "2.0.1"])
def test_install_refuses_other_torch_and_changes_nothing(
    repo, site, torch_dist, version
):
    before = site_state(site)
    torch_dist.version = version
    with pytest.raises(overlay.OverlayError, match="upstream|needs torch 2.1.x"):
        overlay.install(repo, torch_dist, BASE, FakeBuild())
    assert site_state(site) == before


def test_patch_that_does_not_apply_changes_nothing(repo, site, torch_dist):
    before = site_state(site)
    patch = sorted(BASE.patches(repo).glob("*.patch"))[1]
    # Corrupt a context line of the distributed.py hunk.
    text = patch.read_text()
    assert "\n RPC_AVAILABLE = False\n" in text
    patch.write_text(
        text.replace("\n RPC_AVAILABLE = False\n", "\n RPC_AVAILABLE = None\n", 1)
    )
    with pytest.raises(
        overlay.OverlayError, match="does not apply to the files of the installed torch"
    ):
        overlay.install(repo, torch_dist, BASE, FakeBuild())
    assert site_state(site) == before


def test_failed_build_changes_nothing(repo, site, torch_dist):
    before = site_state(site)
    with pytest.raises(overlay.OverlayError, match="compiler said no"):
        overlay.install(
            repo,
            torch_dist,
            BASE,
            FakeBuild(error=overlay.OverlayError("compiler said no")),
        )
    assert site_state(site) == before


def test_modified_torch_is_refused(repo, site, torch_dist):
    with open(site / "torch/nn/parallel/distributed.py", "a") as f:
        f.write("# local change\n")
    before = site_state(site)
    with pytest.raises(
        overlay.OverlayError,
        match="differs from the file the torch 2.1.2 wheel installed",
    ):
        overlay.install(repo, torch_dist, BASE, FakeBuild())
    assert site_state(site) == before


# The scripts


@pytest.mark.parametrize(
    "script", ["overlay", "test", "demo", "mutants", "apply", "build", "submit", "lint"]
)
def test_scripts_have_help(script):
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / script), "--help"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: scripts/{script}")


@pytest.mark.parametrize(
    "version, message",
    [
        ("2.13.0", "has DistributedDataParallel._update_process_group upstream"),
        ("2.0.1", "needs torch 2.1.x"),
    ],
)
def test_overlay_install_refuses_a_venv_with_other_torch(tmp_path, version, message):
    # A stand-in venv whose python reports that torch version, and would fail at anything else.
    fake_command(tmp_path / "venv" / "bin", "python", f"echo {version}")
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "overlay"),
            "install",
            "--venv",
            str(tmp_path / "venv"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert f"torch {version} " in result.stderr and message in result.stderr
