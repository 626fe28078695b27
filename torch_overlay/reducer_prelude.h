// Prelude for the reducer.cpp and logger.cpp additions that the overlay
// extracts from the patch series and compiles against the wheel's headers. The
// additions are compiled inside namespace c10d, as in those files.
//
// The wheel does not ship reducer.cpp, so what the additions use from its
// anonymous namespace is declared here, with the value it has in v2.1.2 and
// v2.14.1.

#pragma once

// The functions of libtorch that the series changes get other names, first.
#include "overlay_renames.h"

#include <c10/util/Optional.h>
#include <torch/csrc/distributed/c10d/logger.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

namespace c10d {
namespace {

// reducer.cpp: the division factor before set_divide_factor() computes it.
constexpr int kUnsetDivFactor = -1;

} // namespace
} // namespace c10d
