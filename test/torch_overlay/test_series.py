"""Reading the series: the role of each file it changes, and what the overlay refuses."""

import pytest

from overlay_fixtures import BASE_CPP, CHANGED_CPP, make_patch, ORIGINALS, PATCHES, REPO
from torch_overlay import bases, commits, series

BASE_LINES = "".join(f"base {n}\n" for n in range(1, 21))
GLOO_CPP = "torch/csrc/distributed/c10d/gloo/ProcessGroupGlooReconfigure.cpp"
GLOO_BASE = "".join(f"int base_{n};\n" for n in range(1, 11)) + (
    "c10::intrusive_ptr<Work> ProcessGroupGloo::reconfigure(\n"
    "    const ReconfigureOptions& opts) {\n"
    "  auto handles = getOrderedReconfigureHandles(opts);\n"
    "  return makeCompletedWork();\n"
    "}\n" + "".join(f"int tail_{n};\n" for n in range(1, 11))
)


def test_series_roles(site):
    s = series.read_series(PATCHES, site)
    assert sorted(series.find_installed_path(p) for p in s.applied) == sorted(ORIGINALS)
    assert s.added and {f.path for f in s.added} <= set(series.COMPILED)
    assert "Reducer::update_process_group" in {f.name for f in s.added}


def test_later_patch_may_change_what_an_earlier_one_added(tmp_path, site):
    first = BASE_LINES.replace("base 10\n", "base 10\nvoid X::f() {\n  old();\n}\n")
    second = first.replace("  old();\n", "  new_a();\n  new_b();\n")
    s = series.read_series(
        make_patch(tmp_path, series.LOGGER_CPP, BASE_LINES, first, second), site
    )
    assert [(f.patch[:4], f.first_line, f.text, f.changes_base) for f in s.added] == [
        ("0001", 11, "void X::f() {\n  new_a();\n  new_b();\n}\n", False)
    ]


def test_a_line_added_outside_a_whole_function_is_refused(tmp_path, site):
    patches = make_patch(
        tmp_path,
        series.REDUCER_CPP,
        BASE_LINES,
        BASE_LINES.replace("base 2\n", "base 2\nint g;\n"),
    )
    with pytest.raises(series.SeriesError, match="not show inside a whole function"):
        series.read_series(patches, site)


def test_removing_a_base_line_outside_a_whole_function_is_refused(tmp_path, site):
    first = BASE_LINES.replace("base 10\n", "base 10\nvoid X::f() {}\n")
    second = first.replace("base 11\n", "")
    with pytest.raises(series.SeriesError, match="0002.*without showing all of it"):
        series.read_series(
            make_patch(tmp_path, series.REDUCER_CPP, BASE_LINES, first, second), site
        )


def test_a_file_the_overlay_cannot_carry_is_refused(tmp_path, site):
    patches = make_patch(
        tmp_path, "torch/csrc/distributed/c10d/Missing.hpp", "a\n", "b\n"
    )
    with pytest.raises(
        series.SeriesError, match="Missing.hpp, which the wheel does not ship"
    ):
        series.read_series(patches, site)


def test_changed_function_is_taken_whole(tmp_path, site):
    added = CHANGED_CPP.replace(
        "int tail_1;\n", "void Reducer::g() {\n  new_g();\n}\nint tail_1;\n"
    )
    patches = make_patch(
        tmp_path, series.REDUCER_CPP, BASE_CPP, added, extra=["--function-context"]
    )
    s = series.read_series(patches, site)
    assert [(r.name, r.first_line, r.binding, r.renamed) for r in s.replaced] == [
        ("Reducer::f", 11, "_f", "_overlay_replaced_f")
    ]
    assert (
        s.replaced[0].text
        == CHANGED_CPP[
            CHANGED_CPP.index("bool Reducer::f(") : CHANGED_CPP.index("int tail_1")
        ]
    )
    # Its first line changed: its return type may have, so the overlay carries it through
    # its binding, not its relocations (carriage.decide_carriage).
    assert s.replaced[0].lines[0].patch is not None
    assert [f.text for f in s.added] == ["void Reducer::g() {\n  new_g();\n}\n"]


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
        series.read_series(patches, site)


def test_a_changed_function_outside_the_renamed_files_is_refused(tmp_path, site):
    patches = make_patch(
        tmp_path,
        series.BACKEND_CPP,
        BASE_CPP,
        CHANGED_CPP,
        extra=["--function-context"],
    )
    with pytest.raises(series.SeriesError, match="changes Reducer::f of .*Backend.cpp"):
        series.read_series(patches, site)


def test_added_constant_is_a_declaration(tmp_path, site):
    constant = 'constexpr const char* kNote =\n    "a note";\n'
    added = CHANGED_CPP.replace(
        "int tail_1;\n",
        f"{constant}void Reducer::g() {{\n  use(kNote);\n}}\nint tail_1;\n",
    )
    patches = make_patch(
        tmp_path, series.REDUCER_CPP, BASE_CPP, added, extra=["--function-context"]
    )
    s = series.read_series(patches, site)
    assert [d.text for d in s.declarations] == [constant]
    assert [f.text for f in s.added] == ["void Reducer::g() {\n  use(kNote);\n}\n"]


def test_statements_at_the_start_of_an_uncompilable_function_are_a_prologue(
    tmp_path, site
):
    changed = GLOO_BASE.replace(
        "    const ReconfigureOptions& opts) {\n",
        "    const ReconfigureOptions& opts) {\n  bumpReconfigureGeneration();\n",
    )
    patches = make_patch(
        tmp_path, GLOO_CPP, GLOO_BASE, changed, extra=["--function-context"]
    )
    s = series.read_series(patches, site)
    assert s.replaced == [] and s.added == []
    [prologue] = s.prologues
    assert prologue.name == "ProcessGroupGloo::reconfigure"
    assert prologue.head == (
        "c10::intrusive_ptr<Work> ProcessGroupGloo::reconfigure(\n"
        "    const ReconfigureOptions& opts) {\n"
    )
    assert prologue.statements == "  bumpReconfigureGeneration();\n"
    assert prologue.first_line == 13


@pytest.mark.parametrize(
    "change",
    [
        # A statement that is not at the start.
        lambda text: text.replace(
            "  return makeCompletedWork();\n",
            "  bump();\n  return makeCompletedWork();\n",
        ),
        # A line of the function changed.
        lambda text: text.replace("  auto handles", "  const auto handles"),
        # A function added.
        lambda text: text.replace(
            "int tail_1;\n", "void ProcessGroupGloo::g() {\n}\nint tail_1;\n"
        ),
    ],
    ids=["later statement", "changed line", "added function"],
)
def test_anything_but_a_prologue_of_an_uncompilable_function_is_refused(
    tmp_path, site, change
):
    patches = make_patch(
        tmp_path, GLOO_CPP, GLOO_BASE, change(GLOO_BASE), extra=["--function-context"]
    )
    with pytest.raises(series.SeriesError, match="which the overlay cannot compile"):
        series.read_series(patches, site)


INIT_BASE = (
    "".join(f"int line_{n};\n" for n in range(1, 11))
    + (
        '          .def(\n              "_f",\n              &::c10d::Reducer::f,\n'
        "              py::call_guard<py::gil_scoped_release>())\n"
    )
    + "".join(f"int tail_{n};\n" for n in range(1, 11))
)


def test_init_cpp_may_change_only_the_binding_of_a_changed_function(tmp_path, site):
    # Reducer::f stays libtorch's here, so its binding cannot change.
    changed = INIT_BASE.replace(
        "              &::c10d::Reducer::f,\n",
        "              [](::c10d::Reducer& reducer, int a) { reducer.f(a); },\n"
        '              py::arg("a"),\n',
    )
    patches = make_patch(tmp_path, series.INIT_CPP, INIT_BASE, changed)
    with pytest.raises(
        series.SeriesError,
        match="changes the init.cpp bindings _f, which bind no function",
    ):
        series.read_series(patches, site)


def test_init_cpp_may_not_change_lines_outside_a_binding(tmp_path, site):
    patches = make_patch(
        tmp_path, series.INIT_CPP, INIT_BASE, INIT_BASE.replace("int line_9;\n", "")
    )
    with pytest.raises(
        series.SeriesError,
        match="removes line 9, a line of the base file, outside a binding",
    ):
        series.read_series(patches, site)


def test_v2_14_series_roles(tmp_path):
    # The files the v2.14.1 wheel ships, as placeholders: roles depend only on which exist.
    upstream = bases.get("v2.14.1")
    site = tmp_path / "site-packages"
    for patch in commits.list_patches(upstream.patches(REPO)):
        for line in patch.read_text().splitlines():
            if line.startswith("+++ b/") and not line.endswith(".cpp"):
                path = series.find_installed_path(line[len("+++ b/") :])
                (site / path).parent.mkdir(parents=True, exist_ok=True)
                (site / path).write_text("")
    s = series.read_series(upstream.patches(REPO), site)
    # Only reducer.cpp and logger.cpp functions are renamed, and each is libtorch's.
    assert s.replaced and all(r.path in series.RENAMED for r in s.replaced)
    assert all(r.changes_base for r in s.replaced)
    assert "torch/nn/parallel/distributed.py" in s.applied
    # Its fixes alone are a series of their own.
    fixes = series.read_series(
        upstream.patches(REPO), site, count=len(upstream.fix_patches(REPO))
    )
    assert len(fixes.patches) < len(s.patches)
