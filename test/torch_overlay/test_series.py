"""Reading the series: the role of each file it changes, and what the overlay refuses."""

import pytest

from overlay_fixtures import BASE_CPP, CHANGED_CPP, make_patch, ORIGINALS, PATCHES, REPO
from torch_overlay import bases, codegen, series


def test_series_roles(site):
    s = series.read_series(PATCHES, site)
    assert sorted(series.installed_path(p) for p in s.applied) == sorted(ORIGINALS)
    assert s.fragments and {f.path for f in s.fragments} == set(series.COMPILED)
    assert "bool Reducer::reset_state() {" in "".join(f.text for f in s.fragments)


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
    source = codegen.generate_additions(s)
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
    source = codegen.generate_additions(s)
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
