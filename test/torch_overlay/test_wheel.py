"""Tests of torch_overlay.wheel: the installed headers' guard."""

from torch_overlay import wheel

SOURCE_HEADER = b"#pragma once\n\n#include <vector>\n\nint f();\n"
# As torch >= 2.9's setup.py installs it.
INSTALLED_HEADER = (
    b"#if !defined(TORCH_STABLE_ONLY) && !defined(TORCH_TARGET_VERSION)\n"
    + SOURCE_HEADER
    + b'\n#else\n#error "This file should not be included when either TORCH_STABLE_ONLY'
    b' or TORCH_TARGET_VERSION is defined."\n#endif  // !defined(TORCH_STABLE_ONLY)'
    b" && !defined(TORCH_TARGET_VERSION)\n"
)


def test_unwrap_header_gives_the_source_text():
    assert wheel.unwrap_header(INSTALLED_HEADER) == SOURCE_HEADER


def test_unwrap_header_leaves_an_unguarded_header_as_it_is():
    # torch 2.1.2 installs its headers as in the sources.
    assert wheel.unwrap_header(SOURCE_HEADER) == SOURCE_HEADER


def test_wrap_header_as_puts_back_the_guard_the_installed_header_had():
    patched = SOURCE_HEADER.replace(
        b"#include <vector>\n", b"#include <atomic>\n#include <vector>\n"
    )
    wrapped = wheel.wrap_header_as(INSTALLED_HEADER, patched)
    assert wrapped == INSTALLED_HEADER.replace(
        b"#include <vector>\n", b"#include <atomic>\n#include <vector>\n"
    )
    assert wheel.unwrap_header(wrapped) == patched


def test_wrap_header_as_adds_no_guard_to_an_unguarded_header():
    assert wheel.wrap_header_as(SOURCE_HEADER, b"int g();\n") == b"int g();\n"
