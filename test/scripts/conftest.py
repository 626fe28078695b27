"""Fixtures for the scripts' tests: the wheel's base files and a stand-in PyTorch checkout."""

import importlib.machinery
import importlib.util
import pathlib
import subprocess
import sys

import pytest

from torch_overlay import series, testing
from torch_overlay.testing import BASE
from torch_overlay.wheel import Torch

REPO = pathlib.Path(__file__).resolve().parents[2]
PATCHES = BASE.patches(REPO)
GIT = ["git", "-c", "user.name=Test", "-c", "user.email=test@example.com"]
# The identity in the pytorch_tree checkout's own git config.
USER = ("Pat Contributor", "pat@example.com")


WHEEL_ORIGINALS = testing.read_wheel_originals(REPO, "test/scripts")


# The C++ sources of the tree that the series changes, which the wheel lacks.
SOURCES = sorted(series.read_series(PATCHES, Torch.find().site_packages).base_lines)


def stand_in(path: str) -> str:
    """A file with the lines of the base file that the series' hunks show, and nothing else.

    Lines that are apart in the base file are kept apart by a marker line.
    """
    torch = Torch.find()
    base_lines = series.read_series(PATCHES, torch.site_packages).base_lines[path]
    assert base_lines, f"the series does not change {path}"
    text, last = [], None
    for number in sorted(base_lines):
        if last is not None and number != last + 1:
            text.append("// stand-in\n")
        text.append(base_lines[number])
        last = number
    return "".join(text)


# The modules of scripts/ that the scripts import from their own folder, each after those it imports.
SCRIPT_HELPERS = ("_common", "_runs", "_checkout", "_stack")


def load_module(path: pathlib.Path, name: str, register: bool = False):
    """Load the file ``path`` (with or without .py) as the module ``name``, for its functions.

    With ``register``, it goes into sys.modules once, so that what imports ``name`` later, as
    the scripts import their helpers from their own folder, gets this module.
    """
    if register and name in sys.modules:
        return sys.modules[name]
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    loader.exec_module(module)
    return module


def load_helper(name: str):
    """Load scripts/NAME.py, one of SCRIPT_HELPERS, as the scripts import it."""
    for helper in SCRIPT_HELPERS[: SCRIPT_HELPERS.index(name) + 1]:
        load_module(REPO / "scripts" / f"{helper}.py", helper, register=True)
    return sys.modules[name]


def load_script(name: str):
    """Load scripts/NAME (a file without .py) as a module, for its functions."""
    load_helper(SCRIPT_HELPERS[-1])  # and those before it
    return load_module(REPO / "scripts" / name, name)


def fake_command(bin_dir, name, body="exit 0"):
    """An executable ``bin_dir/name`` that runs the shell commands ``body``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
    (bin_dir / name).chmod(0o755)
    return bin_dir / name


def git(tree, *args):
    return subprocess.run(
        GIT + ["-C", str(tree), *args], capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture
def pytorch_tree(tmp_path):
    """A git checkout shaped like the release/2.1 tree, as far as the series and the scripts look."""
    tree = tmp_path / "pytorch"
    files = {
        "setup.py": "# stand-in\n",
        "version.txt": "2.1.0a0\n",
        **{path: stand_in(path) for path in SOURCES},
    }
    for installed, data in WHEEL_ORIGINALS.items():
        (tree / installed.removeprefix("torch/include/")).parent.mkdir(
            parents=True, exist_ok=True
        )
        (tree / installed.removeprefix("torch/include/")).write_bytes(data)
    for path, text in files.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(text)
    subprocess.run(GIT + ["init", "-q", "-b", "main", str(tree)], check=True)
    # Whose checkout it is: scripts/apply makes the applied commits theirs.
    git(tree, "config", "user.name", USER[0])
    git(tree, "config", "user.email", USER[1])
    git(tree, "add", "-A")
    git(tree, "commit", "-qm", "base")
    return tree
