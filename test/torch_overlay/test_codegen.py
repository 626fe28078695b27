"""The generated sources of the extension."""

import re

from overlay_fixtures import BASE_CPP, CHANGED_CPP, make_patch, PATCHES
from torch_overlay import codegen, cpp_classes, series
from torch_overlay.cpp_hunks import Prologue

HEAD = (
    "c10::intrusive_ptr<Work> ProcessGroupGloo::reconfigure(\n"
    "    const ReconfigureOptions& opts) {\n"
)


def test_additions_source_points_into_reducer_cpp(site):
    source = codegen.generate_additions(series.read_series(PATCHES, site))
    assert '#include "reducer_prelude.h"' in source
    assert re.search(r'#line \d+ "torch/csrc/distributed/c10d/reducer.cpp"', source)
    assert "std::vector<RedirectedSlots> install_redirects() {" in source


def test_renames_reach_only_the_changed_functions(tmp_path, site):
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
    header = codegen.generate_renames(series.read_series(patches, site), include)
    # What the two headers include comes before the rename, and not the headers themselves.
    assert header.splitlines()[-3:] == [
        "#include <mutex>",
        "#include <c10/core/ScalarType.h>",
        "#define f _overlay_replaced_f",
    ]
    # Of libtorch 2.1.2's functions, the v2.1.2 series changes finalize_backward() alone; the
    # functions that its backport adds are new to libtorch, and are not renamed.
    source = codegen.generate_renames(series.read_series(PATCHES, site), include)
    assert [line for line in source.splitlines() if "#define" in line] == [
        "#define finalize_backward _overlay_replaced_finalize_backward"
    ]


def test_a_changed_function_is_redirected_from_its_renamed_code(tmp_path, site):
    patches = make_patch(
        tmp_path,
        series.REDUCER_CPP,
        BASE_CPP,
        CHANGED_CPP,
        extra=["--function-context"],
    )
    source = codegen.generate_additions(series.read_series(patches, site))
    assert "// changes c10d::Reducer::f\n#line 11" in source and "new_c();" in source
    # Its address is taken through a class derived from its own: it may be protected.
    assert (
        "struct AccessToReducer : ::c10d::Reducer {\n"
        "  static void* code_of_f() {\n"
        "    return code_of(&AccessToReducer::_overlay_replaced_f);\n"
        "  }\n};"
    ) in source
    # Its first line (the return type) changed: redirect.cpp leaves it to its binding.
    assert (
        "redirect_changed_function(\n"
        "      AccessToReducer::code_of_f(),\n"
        "      /*first_line_kept=*/false)"
    ) in source


INIT_BINDING = """      .def(
          "_update_process_group",
          [](::c10d::Reducer& reducer,
             c10::intrusive_ptr<::c10d::ProcessGroup> new_process_group,
             bool agree) {
            return reducer.update_process_group(new_process_group, agree);
          },
          py::arg("new_process_group"),
          py::arg("agree") = false,
          py::call_guard<py::gil_scoped_release>());
"""


def test_the_module_binds_each_def_of_the_init_cpp_hunks(tmp_path, site):
    base = "".join(f"int line_{n};\n" for n in range(1, 11))
    patches = make_patch(tmp_path, series.INIT_CPP, base, base + INIT_BINDING)
    s = series.read_series(patches, site)
    [binding] = s.bindings
    assert (binding.owner, binding.name, binding.first_line) == (
        "Reducer",
        "_update_process_group",
        11,
    )
    module = codegen.generate_module(s)
    # The hunk's own callable and arguments, set on the class that torch registered.
    assert (
        '    py::object owner = c10d.attr("Reducer");\n'
        '    owner.attr("_update_process_group") = py::cpp_function(\n'
        '#line 13 "torch/csrc/distributed/c10d/init.cpp"\n'
        "        [](::c10d::Reducer& reducer,\n"
    ) in module
    assert (
        '        py::name("_update_process_group"),\n'
        "        py::is_method(owner),\n"
        '        py::arg("new_process_group"),\n'
        '        py::arg("agree") = false,\n'
        "        py::call_guard<py::gil_scoped_release>());\n"
    ) in module
    assert "torch_overlay::install_redirects();" in module


def test_a_prologue_runs_before_libtorchs_definition():
    prologue = Prologue(
        path="torch/csrc/distributed/c10d/gloo/X.cpp",
        name="ProcessGroupGloo::reconfigure",
        head=HEAD,
        statements="  bumpReconfigureGeneration();\n",
        first_line=13,
    )
    target = codegen.PrologueTarget(
        prologue,
        "_ZN4c10d16ProcessGroupGloo11reconfigureERKNS_18ReconfigureOptionsE",
        "c10d",
        "Backend",
    )
    source = codegen.generate_additions(_empty_series(), prologues=[target])
    carrier = source[source.index("namespace torch_overlay_prologue_0") :]
    # A member of the class's base, declared and defined with the function's parameters,
    # that runs the statements and then calls libtorch's definition with them.
    assert (
        "struct Carrier : Backend {\n  c10::intrusive_ptr<Work> run(\n    const ReconfigureOptions& opts);\n};"
        in carrier
    )
    assert (
        "  bumpReconfigureGeneration();\n"
        "  return (this->*stock)(std::forward<decltype(opts)>(opts));\n}"
    ) in carrier
    assert '#line 13 "torch/csrc/distributed/c10d/gloo/X.cpp"' in carrier
    assert f'find_definition("{target.symbol}")' in source


def test_the_parameters_of_a_head_are_forwarded_by_name():
    head = (
        "int A::f(\n    const std::map<int, int>& m,\n    int n = 3,\n    char* s) {\n"
    )
    assert codegen._list_parameter_names(head, "A::f") == ["m", "n", "s"]
    assert codegen._list_parameter_names("void A::g() {\n", "A::g") == []


STOCK = """namespace c10d {
class TORCH_API Backend {
 public:
  int getRank() const;
 protected:
  int rank_;
};
} // namespace c10d
"""
PATCHED = STOCK.replace(
    "  int rank_;\n",
    "  int rank_;\n  // Note [Reconfigure generation]\n"
    "  std::atomic<uint64_t> reconfigure_generation_{0};\n",
)


def test_an_added_member_is_reached_through_its_shim():
    members = cpp_classes.find_added_members("Backend.hpp", STOCK, PATCHED)
    source = codegen.generate_additions(_empty_series(), members=members)
    # The member lives in a struct of its own, which an accessor keyed by the object gives.
    assert (
        "struct TorchOverlayAddedMembersOfBackend {\n"
        "  std::atomic<uint64_t> reconfigure_generation_{0};\n};"
    ) in source
    assert (
        "#define reconfigure_generation_ "
        "(::c10d::torch_overlay_added_members(this).reconfigure_generation_)"
    ) in source
    # The macro comes after the struct, so that the struct's member keeps its name.
    assert source.index("struct TorchOverlayAddedMembersOfBackend") < source.index(
        "#define reconfigure_generation_"
    )
    # Both destructors of the class erase the object's entry once they have run.
    for variant in ("D1", "D2"):
        symbol = codegen.mangle_destructor("c10d::Backend", variant)
        assert symbol == f"_ZN4c10d7Backend{variant}Ev"
        assert f'find_definition("{symbol}")' in source


def _empty_series():
    return series.Series(
        patches=[],
        applied=[],
        added=[],
        declarations=[],
        replaced=[],
        prologues=[],
        bindings=[],
        base_lines={},
    )
