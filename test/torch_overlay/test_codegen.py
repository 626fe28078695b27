"""The generated sources of the extension."""

import re

from overlay_fixtures import BASE_CPP, CHANGED_CPP, make_patch, PATCHES, REPO
from torch_overlay import codegen, series


def test_additions_source_points_into_reducer_cpp(site):
    source = codegen.generate_additions(series.read_series(PATCHES, site))
    assert '#include "reducer_prelude.h"' in source
    assert re.search(r'#line \d+ "torch/csrc/distributed/c10d/reducer.cpp"', source)


# A series on a base whose libtorch has the functions it changes (v2.14.1)


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
    header = codegen.generate_renames(
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
    source = codegen.generate_renames(series.read_series(PATCHES, site), include)
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
        assert [codegen.format_binding_macro(n) for n in names] == [macro]
    assert len(re.findall(r"py::name\(\"", text)) == text.count("#ifdef ")
