// Prelude for the reducer.cpp and logger.cpp additions that the overlay
// extracts from the patch series and compiles against the wheel's headers. The
// additions are compiled inside namespace c10d, as in those files.
//
// The wheel does not ship reducer.cpp, so what the additions use from its
// anonymous namespace is declared here, as the base's reducer.cpp has it.

#pragma once

// The functions of libtorch that the series changes get other names, first.
#include "overlay_renames.h"

#include <c10/util/Optional.h>
#include <torch/csrc/distributed/c10d/logger.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

namespace c10d {
namespace {

// reducer.cpp (v2.1.2 and v2.14.1): the division factor before
// set_divide_factor() computes it.
constexpr int kUnsetDivFactor = -1;

// reducer.cpp (v2.1.2 and v2.14.1): TORCH_CHECK that
// also records the error in DDP's logging data.
#define REDUCER_CHECK(cond, logger_, ...)             \
  if (C10_UNLIKELY_OR_CONST(!(cond))) {               \
    if (!logger_.expired()) {                         \
      logger_.lock()->set_error_and_log(__VA_ARGS__); \
    }                                                 \
    TORCH_CHECK(false, ##__VA_ARGS__);                \
  }

} // namespace
} // namespace c10d
