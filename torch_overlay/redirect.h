// Redirects the calls that the loaded libraries make to a function of libtorch
// through their relocations, so that libtorch's own callers reach the
// definition the patch series changed. See redirect.cpp.

#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace torch_overlay {

// The relocations of one loaded library that were pointed elsewhere.
struct RedirectedSlots {
  std::string symbol;
  std::string library;
  // R_*_JUMP_SLOT (calls through the PLT), R_*_GLOB_DAT (the address loaded
  // from the GOT) and R_*_64 (a pointer in data, such as a vtable slot).
  size_t jump_slots = 0;
  size_t got_entries = 0;
  size_t data_pointers = 0;
};

// Points every relocation that refers to the dynamic symbol `symbol`, in every
// loaded library but the one that holds `replacement`, at `replacement`.
// Returns what it changed, per library. Raises (TORCH_CHECK) where a slot
// cannot be written.
std::vector<RedirectedSlots> redirect(
    const std::string& symbol,
    void* replacement);

// The address of the dynamic symbol `symbol` as the library that defines it
// exports it (not as a relocation now points), for a wrapper that calls the
// definition it replaces; nullptr where no loaded library defines it.
void* find_definition(const std::string& symbol);

// Points libtorch's relocations that refer to a function the series changes at
// `patched`, its patched definition, which the extension compiled under the
// name codegen.py renames it to (_overlay_replaced_<name>). Only where its
// signature is libtorch's: its first line unchanged (`first_line_kept`: the
// return type, as c10d writes it) and its parameters, which the mangled name
// holds. Otherwise the series changed its signature, and the Python binding
// that the extension's module replaces is what reaches the patched definition;
// returns nothing then.
std::vector<RedirectedSlots> redirect_changed_function(
    void* patched,
    bool first_line_kept);

// The extension's redirects: the functions the series changes, the statements
// it adds at the start of functions the overlay cannot compile, and the
// destructors that erase the shims of added data members. Generated from the
// series (codegen.py); called once, when the extension loads.
std::vector<RedirectedSlots> install_redirects();

} // namespace torch_overlay
