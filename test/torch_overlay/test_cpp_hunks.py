"""torch_overlay.cpp_hunks: what the series' C++ hunks show, on small hand-made ones."""

import re

import pytest
import unidiff

from torch_overlay import cpp_hunks
from torch_overlay.cpp_hunks import KnownLine, Prologue, SeriesError, WholeFunction


def _patched_file(hunks, path="reducer.cpp"):
    """Return the one file diff of a diff of ``path`` made of ``hunks``."""
    [patched_file] = unidiff.PatchSet(f"--- a/{path}\n+++ b/{path}\n{hunks}")
    return patched_file


def test_function_spans_run_from_a_column_0_head_to_a_column_0_brace():
    lines = [
        "namespace c10d {\n",
        "\n",
        "// Reducer::f() below.\n",
        "bool Reducer::reset_state() {\n",
        "  if (ready_) {\n",
        "    helper::call(x);\n",
        "  }\n",
        "  return true;\n",
        "}\n",
        "\n",
        "std::vector<at::Tensor> Reducer::\n",
        "    get_grads(int a) {\n",
        "  return {};\n",
        "}\n",
        "int base_1;\n",
        "void Reducer::half_shown() {\n",
        "  cut();\n",
    ]
    # The function whose closing brace the lines do not show has no span.
    assert cpp_hunks._find_function_spans(lines) == [(3, 8), (10, 13)]


@pytest.mark.parametrize(
    "lines, starts",
    [
        (["bool Reducer::reset_state() {\n"], True),
        (["void Reducer::update_process_group(\n"], True),
        (["std::vector<at::Tensor> Reducer::\n", "    get_grads(int a) {\n"], True),
        (["std::vector<at::Tensor> Reducer::\n", "    int x;\n"], False),
        (["std::vector<at::Tensor> Reducer::\n"], False),
        (["  helper::call(x);\n"], False),
        (["void free_function() {\n"], False),
        (["// Reducer::f() does this.\n"], False),
        (["Reducer::Reducer(\n"], True),
        (["Reducer::~Reducer() noexcept(false) {\n"], True),
    ],
    ids=[
        "one-line head",
        "head split before its parameters",
        "head split after the class",
        "class followed by no name",
        "class on the last line",
        "indented call",
        "unqualified function",
        "comment",
        "constructor",
        "destructor",
    ],
)
def test_a_definition_starts_at_a_qualified_name_at_column_0(lines, starts):
    assert cpp_hunks._starts_definition(lines, 0) is starts


@pytest.mark.parametrize(
    "lines, name",
    [
        (["c10d::Reducer::~Reducer() {\n"], "Reducer::~Reducer"),
        (["Reducer::Reducer(\n"], "Reducer::Reducer"),
        (
            ["c10::intrusive_ptr<Work> ProcessGroupGloo::reconfigure(\n"],
            "ProcessGroupGloo::reconfigure",
        ),
        (["void c10d::Reducer::f(int a) {\n"], "Reducer::f"),
        (
            ["std::vector<at::Tensor> Reducer::\n", "    get_grads(int a) {\n"],
            "Reducer::get_grads",
        ),
    ],
    ids=[
        "destructor",
        "constructor",
        "templated return type",
        "namespace",
        "split head",
    ],
)
def test_a_definition_is_named_by_its_class_and_member(lines, name):
    assert cpp_hunks._read_definition_name(lines, 0) == name


def test_arguments_split_only_at_top_level_commas():
    text = (
        ' "_f",\n'
        "  [](::c10d::Reducer& r, std::map<int, std::pair<int, int>> m) {\n"
        "    r.f(m, {1, 2}, v[i, j]);\n"
        "  },\n"
        '  py::arg("a, b") = std::make_tuple(1, 2),\n'
        "  py::call_guard<py::gil_scoped_release>(), "
    )
    assert cpp_hunks._split_arguments(text) == [
        '"_f"',
        "[](::c10d::Reducer& r, std::map<int, std::pair<int, int>> m) {\n"
        "    r.f(m, {1, 2}, v[i, j]);\n"
        "  }",
        'py::arg("a, b") = std::make_tuple(1, 2)',
        "py::call_guard<py::gil_scoped_release>()",
    ]
    assert cpp_hunks._split_arguments("  ") == []


def test_arguments_keep_template_arguments_and_literals_whole():
    text = (
        '"_g", &Reducer::g, py::call_guard<A, B>(), py::arg("x(, y") = \',\', '
        'py::arg("q\\", r")'
    )
    assert cpp_hunks._split_arguments(text) == [
        '"_g"',
        "&Reducer::g",
        "py::call_guard<A, B>()",
        "py::arg(\"x(, y\") = ','",
        'py::arg("q\\", r")',
    ]


def test_the_target_path_drops_the_b_prefix_or_falls_back_to_the_path():
    patch_set = unidiff.PatchSet(
        "--- a/torch/csrc/x.cpp\n+++ b/torch/csrc/x.cpp\n@@ -1,1 +1,1 @@\n-a\n+b\n"
        "--- a/torch/csrc/gone.cpp\n+++ /dev/null\n@@ -1,1 +0,0 @@\n-a\n"
    )
    assert [cpp_hunks.find_target_path(f) for f in patch_set] == [
        "torch/csrc/x.cpp",
        "torch/csrc/gone.cpp",
    ]


def test_known_lines_follow_each_patch_with_their_origin():
    first = _patched_file(
        "@@ -2,2 +2,5 @@\n"
        " int base_2;\n"
        " int base_3;\n"
        "+void Reducer::g() {\n"
        "+  new_g();\n"
        "+}\n"
    )
    changed = set()
    known = cpp_hunks.apply_hunks("0001", first, {}, changed, False)
    assert known == {
        2: KnownLine("int base_2;\n", None, 2),
        3: KnownLine("int base_3;\n", None, 3),
        4: KnownLine("void Reducer::g() {\n", "0001"),
        5: KnownLine("  new_g();\n", "0001"),
        6: KnownLine("}\n", "0001"),
    }
    # A later patch inserts a line above, and replaces a line that 0001 added: no
    # function context is needed for that. Known lines move with the hunks above
    # them, and a base line keeps its number in the base file, not in 0001's.
    second = _patched_file(
        "@@ -2,1 +2,2 @@\n"
        " int base_2;\n"
        "+int added_2;\n"
        "@@ -5,3 +6,4 @@\n"
        "-  new_g();\n"
        "+  newer_g();\n"
        "+  newest_g();\n"
        " }\n"
        " int base_4;\n"
    )
    assert cpp_hunks.apply_hunks("0002", second, known, changed, False) == {
        2: KnownLine("int base_2;\n", None, 2),
        3: KnownLine("int added_2;\n", "0002"),
        4: KnownLine("int base_3;\n", None, 3),
        5: KnownLine("void Reducer::g() {\n", "0001"),
        6: KnownLine("  newer_g();\n", "0002"),
        7: KnownLine("  newest_g();\n", "0002"),
        8: KnownLine("}\n", "0001"),
        9: KnownLine("int base_4;\n", None, 4),
    }
    assert changed == set()


@pytest.mark.parametrize(
    "hunks, is_bindings, name",
    [
        (
            "@@ -3,5 +3,5 @@\n"
            " int base_3;\n"
            " void Reducer::f() {\n"
            "-  old();\n"
            "+  new();\n"
            " }\n"
            " int base_7;\n",
            False,
            "Reducer::f",
        ),
        (
            "@@ -2,4 +2,4 @@\n"
            "       .def(\n"
            '           "_f",\n'
            "-          &::c10d::Reducer::f,\n"
            "+          &::c10d::Reducer::g,\n"
            "           py::call_guard<py::gil_scoped_release>())\n",
            True,
            "_f",
        ),
    ],
    ids=["function", "binding"],
)
def test_removing_a_base_line_records_what_it_changes(hunks, is_bindings, name):
    changed = set()
    cpp_hunks.apply_hunks("0001", _patched_file(hunks), {}, changed, is_bindings)
    assert changed == {name}


@pytest.mark.parametrize(
    "hunks, start",
    [
        # Whole before, but the definition that replaces it is another function's.
        (
            "@@ -3,3 +3,3 @@\n"
            "-void Reducer::f() {\n"
            "+void Reducer::g() {\n"
            "   old();\n"
            " }\n",
            3,
        ),
        # Its head is not shown.
        ("@@ -4,2 +4,2 @@\n-  old();\n+  new();\n }\n", 4),
    ],
    ids=["renamed", "head not shown"],
)
def test_a_base_function_not_shown_whole_before_and_after_is_refused(hunks, start):
    with pytest.raises(SeriesError) as e:
        cpp_hunks.apply_hunks("0001-f.patch", _patched_file(hunks), {}, set(), False)
    assert str(e.value) == (
        f"0001-f.patch: a hunk at reducer.cpp:{start} changes a function of the base "
        "file without showing all of it, before and after. The overlay takes a changed "
        "function whole, from the hunk: make the series' .cpp diffs with git "
        "format-patch --function-context (tools/format_series.py does)."
    )


def test_a_hunk_whose_context_differs_from_the_known_lines_is_refused():
    known = {4: KnownLine("void Reducer::g() {\n", "0001")}
    hunk = _patched_file("@@ -4,1 +4,2 @@\n void Reducer::h() {\n+  h();\n")
    with pytest.raises(
        SeriesError,
        match=re.escape(
            "0002: a hunk at reducer.cpp:4 does not fit the lines that the patches "
            "before it leave there"
        ),
    ):
        cpp_hunks.apply_hunks("0002", hunk, known, set(), False)


def test_whole_changes_are_the_functions_and_constants_a_patch_touched():
    lines = [
        ("// A comment.\n", None),
        ("void Reducer::kept() {\n", None),
        ("  same();\n", None),
        ("}\n", None),
        ("bool Reducer::f(\n", "0002"),
        ("    int a) {\n", None),
        ("  new_c();\n", "0002"),
        ("}\n", None),
        ("constexpr int kLimit =\n", "0001"),
        ("    4;\n", "0001"),
        ("std::pair<int, int> Reducer::\n", "0001"),
        ("    added(int a) {\n", "0001"),
        ("  return {a, a};\n", "0001"),
        ("}\n", "0001"),
        ("\n", "0001"),
        ("// An added comment.\n", "0001"),
    ]
    known = {10 + i: KnownLine(text, patch) for i, (text, patch) in enumerate(lines)}
    # A second run of known lines: a base function with an added line.
    known[40] = KnownLine("void Reducer::base_head() {\n", None, 30)
    known[41] = KnownLine("  added();\n", "0003")
    known[42] = KnownLine("}\n", None, 31)
    functions, declarations = cpp_hunks.find_whole_changes(
        "reducer.cpp", known, {"Reducer::f"}
    )
    assert [
        (f.name, f.first_line, f.text, f.patch, f.changes_base) for f in functions
    ] == [
        (
            "Reducer::f",
            14,
            "bool Reducer::f(\n    int a) {\n  new_c();\n}\n",
            "0002",
            True,
        ),
        (
            "Reducer::added",
            20,
            "std::pair<int, int> Reducer::\n    added(int a) {\n  return {a, a};\n}\n",
            "0001",
            False,
        ),
        (
            "Reducer::base_head",
            40,
            "void Reducer::base_head() {\n  added();\n}\n",
            "0003",
            True,
        ),
    ]
    assert functions[2].lines == (known[40], known[41], known[42])
    assert declarations == [
        cpp_hunks.Declaration(
            "reducer.cpp", 18, "constexpr int kLimit =\n    4;\n", "0001"
        )
    ]


def test_a_constant_that_the_hunks_cut_off_is_refused():
    known = {
        5: KnownLine("constexpr int kLimit =\n", "0001"),
        6: KnownLine("    4;\n", "0002"),
    }
    with pytest.raises(SeriesError) as e:
        cpp_hunks.find_whole_changes("reducer.cpp", known, set())
    assert str(e.value) == (
        "0001: it adds reducer.cpp:5 (constexpr int kLimit =), which the hunks do not "
        "show inside a whole function. The overlay takes changed and added functions "
        "whole: make the series' .cpp diffs with git format-patch --function-context "
        "(tools/format_series.py does)."
    )


def _gloo_function(*body):
    """Return ProcessGroupGloo::reconfigure of a three-line head, with ``body``."""
    lines = (
        KnownLine(
            "c10::intrusive_ptr<Work> ProcessGroupGloo::reconfigure(\n", None, 40
        ),
        KnownLine("    const ReconfigureOptions& opts,\n", None, 41),
        KnownLine("    bool force) {\n", None, 42),
        *body,
        KnownLine("}\n", None, 44),
    )
    return WholeFunction(
        path="gloo.cpp",
        name="ProcessGroupGloo::reconfigure",
        first_line=50,
        text="".join(line.text for line in lines),
        patch="0004",
        changes_base=True,
        lines=lines,
    )


def test_a_prologue_is_what_a_patch_inserts_after_the_line_that_opens_the_body():
    function = _gloo_function(
        KnownLine("  bump();\n", "0004"),
        KnownLine("  check(opts);\n", "0004"),
        KnownLine("  return makeCompletedWork();\n", None, 43),
    )
    assert cpp_hunks.make_prologue(function, set()) == Prologue(
        path="gloo.cpp",
        name="ProcessGroupGloo::reconfigure",
        head=(
            "c10::intrusive_ptr<Work> ProcessGroupGloo::reconfigure(\n"
            "    const ReconfigureOptions& opts,\n"
            "    bool force) {\n"
        ),
        statements="  bump();\n  check(opts);\n",
        first_line=53,
    )


def test_a_prologue_with_a_base_line_inside_it_is_refused():
    function = _gloo_function(
        KnownLine("  bump();\n", "0004"),
        KnownLine("  return makeCompletedWork();\n", None, 43),
        KnownLine("  unreachable();\n", "0004"),
    )
    with pytest.raises(SeriesError) as e:
        cpp_hunks.make_prologue(function, set())
    assert str(e.value) == (
        "0004: it changes ProcessGroupGloo::reconfigure in gloo.cpp, which the overlay "
        "cannot compile: the wheel lacks what that file includes. There the overlay "
        "carries only statements that the series adds at the start of a function of "
        "the base file, and runs them before libtorch's definition."
    )


def test_bindings_are_the_added_and_the_changed_def_blocks():
    lines = [
        ("      .def(\n", "0001"),
        ('          "_update_process_group",\n', "0001"),
        ("          [](::c10d::Reducer& reducer,\n", "0001"),
        ("             const c10::intrusive_ptr<::c10d::ProcessGroup>& g,\n", "0001"),
        ("             bool agree) { reducer.update(g, agree); },\n", "0001"),
        ('          py::arg("new_process_group"),\n', "0001"),
        ('          py::arg("agree") = false,\n', "0001"),
        ("          py::call_guard<py::gil_scoped_release>())\n", "0001"),
        ("      .def(\n", None),
        ('          "_get_x",\n', None),
        ("          &::c10d::Logger::get_x)\n", None),
        ("      .def(\n", None),
        ('          "_untouched",\n', None),
        ("          &::c10d::Logger::untouched)\n", None),
    ]
    known = {100 + i: KnownLine(text, patch) for i, (text, patch) in enumerate(lines)}
    assert cpp_hunks.find_bindings(known, {"_get_x"}) == [
        cpp_hunks.Binding(
            owner="Reducer",
            name="_update_process_group",
            callable=(
                "[](::c10d::Reducer& reducer,\n"
                "             const c10::intrusive_ptr<::c10d::ProcessGroup>& g,\n"
                "             bool agree) { reducer.update(g, agree); }"
            ),
            extras=(
                'py::arg("new_process_group")',
                'py::arg("agree") = false',
                "py::call_guard<py::gil_scoped_release>()",
            ),
            first_line=100,
            patch="0001",
        ),
        cpp_hunks.Binding(
            owner="Logger",
            name="_get_x",
            callable="&::c10d::Logger::get_x",
            extras=(),
            first_line=108,
            patch="",
        ),
    ]


@pytest.mark.parametrize(
    "callable_lines, message",
    [
        (
            ["          &::c10d::Reducer::f,\n"],
            "0001: the init.cpp binding _f is not shown whole, to its closing "
            "parenthesis; the overlay binds what the hunk holds",
        ),
        (
            ["          [](Reducer& r) { r.f(); })\n"],
            "the init.cpp binding _f names no c10d class in "
            "'[](Reducer& r) { r.f(); }', to bind its method onto",
        ),
    ],
    ids=["not closed", "no c10d class"],
)
def test_a_binding_that_cannot_be_bound_is_refused(callable_lines, message):
    texts = ["      .def(\n", '          "_f",\n', *callable_lines]
    known = {20 + i: KnownLine(text, "0001") for i, text in enumerate(texts)}
    with pytest.raises(SeriesError) as e:
        cpp_hunks.find_bindings(known, set())
    assert str(e.value) == message
