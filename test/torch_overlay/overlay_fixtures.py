"""Helpers of the overlay's tests: the wheel's base files, a stand-in build, patch series made with git.

A module of its own name, not conftest: test/scripts has a conftest too, and a test
that imports "conftest" gets whichever pytest loaded last.
"""

import hashlib
import pathlib
import subprocess

from torch_overlay import testing
from torch_overlay.testing import BASE


REPO = pathlib.Path(__file__).resolve().parents[2]
PATCHES = BASE.patches(REPO)
ORIGINALS = testing.read_wheel_originals(REPO, "test/torch_overlay")


def sha(data: bytes) -> str:
    """Return the hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


class FakeBuild:
    """Stands in for the compiler: records calls, writes a placeholder module."""

    # What install() checks the built module with, which a placeholder cannot pass.
    @staticmethod
    def check(torch, built, series, members):
        pass

    def __init__(self, error=None):
        self.calls = 0
        self.error = error

    def __call__(self, include, series, members):
        self.calls += 1
        assert (include / "torch/csrc/distributed/c10d/reducer.hpp").is_file()
        if self.error:
            raise self.error
        built = include.parent / "_C.cpython-311-x86_64-linux-gnu.so"
        built.write_bytes(b"placeholder")
        return built


def site_state(site):
    return {
        str(p.relative_to(site)): sha(p.read_bytes())
        for p in sorted(site.rglob("*"))
        if p.is_file()
    }


# The series


def make_patch(tmp_path, path, before, *afters, extra=()):
    """A real ``git format-patch`` series that changes ``path`` from ``before`` to each of ``afters`` in turn."""
    work = tmp_path / "scratch"
    work.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(git + ["init", "-q"], cwd=work, check=True)
    (work / path).parent.mkdir(parents=True, exist_ok=True)
    (work / path).write_text(before)
    subprocess.run(git + ["add", "-A"], cwd=work, check=True)
    subprocess.run(git + ["commit", "-qm", "base"], cwd=work, check=True)
    for n, after in enumerate(afters):
        (work / path).write_text(after)
        subprocess.run(git + ["commit", "-qam", f"change {n}"], cwd=work, check=True)
    out = tmp_path / "patches"
    subprocess.run(
        git + ["format-patch", "-q", *extra, f"-{len(afters)}", "-o", str(out)],
        cwd=work,
        check=True,
    )
    return out


BASE_CPP = "".join(f"int base_{n};\n" for n in range(1, 11)) + (
    "void Reducer::f(\n    int a) {\n  old_a();\n  old_b();\n  old_c();\n  old_d();\n  old_e();\n}\n"
    + "".join(f"int tail_{n};\n" for n in range(1, 11))
)

CHANGED_CPP = BASE_CPP.replace("void Reducer::f(", "bool Reducer::f(").replace(
    "  old_c();\n", "  new_c();\n  return true;\n"
)
