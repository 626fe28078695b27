// Stands in for the torch/csrc/distributed/c10d/init.cpp hunks of the patch
// series, which the wheel cannot be rebuilt with: binds the same methods onto
// the Reducer and Logger classes that torch._C._distributed_c10d already
// registered. The extension shares torch's pybind11 type registry, so Reducer,
// Logger and ProcessGroup arguments convert exactly as they do in init.cpp.
//
// Invariant (checked by the series linter): the py::name()s here are, for
// each base, the names that the init.cpp hunks of its whole series bind and
// the bindings of the functions the series changes
// (series.ReplacedFunction.binding), and no name that no series binds. On
// v2.1.2 all of them are new; on v2.14.1, _reset_state and
// _update_process_group replace the wheel's bindings of the old functions.
// Each is compiled where the series at hand makes it, which overlay_renames.h
// says with a TORCH_OVERLAY_BIND_<NAME> macro: a series cut short, such as a
// commit of the stack, binds only what it has.

// Not in clang-format's order: overlay_renames.h comes before reducer.hpp, so
// that a function of libtorch that the series changes is bound under its
// overlay name, in place of the wheel's binding of the old one.
// clang-format off
#include <torch/csrc/utils/pybind.h>
#include "overlay_renames.h"
#include <torch/csrc/distributed/c10d/logger.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
// clang-format on

#include "redirect.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // Before anything can call them: libtorch's callers of the functions the
  // series changes reach the patched definitions from here on.
  static const auto redirected = torch_overlay::install_redirects();
  m.def(
      "_redirected",
      [] {
        std::vector<
            std::tuple<std::string, std::string, size_t, size_t, size_t>>
            slots;
        for (const auto& library : redirected) {
          slots.emplace_back(
              library.symbol,
              library.library,
              library.jump_slots,
              library.got_entries,
              library.data_pointers);
        }
        return slots;
      },
      "The relocations that the extension pointed at its definitions when it "
      "loaded: (symbol, library, PLT slots, GOT entries, data pointers) per "
      "symbol and library.");
  py::module c10d = py::module::import("torch._C._distributed_c10d");
  py::object reducer = c10d.attr("Reducer");
#ifdef TORCH_OVERLAY_BIND_RESET_STATE
  reducer.attr("_reset_state") = py::cpp_function(
      &::c10d::Reducer::reset_state,
      py::name("_reset_state"),
      py::is_method(reducer),
      py::call_guard<py::gil_scoped_release>());
#endif
#ifdef TORCH_OVERLAY_BIND_BACKWARD_PASS_UNFINISHED
  reducer.attr("_backward_pass_unfinished") = py::cpp_function(
      &::c10d::Reducer::backward_pass_unfinished,
      py::name("_backward_pass_unfinished"),
      py::is_method(reducer),
      py::call_guard<py::gil_scoped_release>());
#endif
#ifdef TORCH_OVERLAY_BIND_NEXT_ITERATION_RECORDS_STATIC_GRAPH
  reducer.attr("_next_iteration_records_static_graph") = py::cpp_function(
      &::c10d::Reducer::next_iteration_records_static_graph,
      py::name("_next_iteration_records_static_graph"),
      py::is_method(reducer),
      py::call_guard<py::gil_scoped_release>());
#endif
#ifdef TORCH_OVERLAY_BIND_UPDATE_PROCESS_GROUP
  reducer.attr("_update_process_group") = py::cpp_function(
      &::c10d::Reducer::update_process_group,
      py::name("_update_process_group"),
      py::is_method(reducer),
      py::arg("new_process_group"),
      py::call_guard<py::gil_scoped_release>());
#endif
#ifdef TORCH_OVERLAY_BIND_REMOVE_COMM_HOOK
  reducer.attr("_remove_comm_hook") = py::cpp_function(
      &::c10d::Reducer::remove_comm_hook,
      py::name("_remove_comm_hook"),
      py::is_method(reducer),
      py::call_guard<py::gil_scoped_release>());
#endif

  py::object logger = c10d.attr("Logger");
#ifdef TORCH_OVERLAY_BIND_SET_PROCESS_GROUP_DATA
  logger.attr("_set_process_group_data") = py::cpp_function(
      &::c10d::Logger::set_process_group_data,
      py::name("_set_process_group_data"),
      py::is_method(logger),
      py::call_guard<py::gil_scoped_release>());
#endif
}
