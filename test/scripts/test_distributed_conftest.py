"""test/distributed/conftest.py: the ranks of a MultiProcessTestCase start from a forkserver,
fresh, and a rank that fails still fails its case."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

# Each rank writes its parent's pid, and whether it sees what pytest's process set after the
# test file was imported: a rank forked from pytest's process would see it.
CASES = """
import os
import pathlib
import sys

from torch.testing._internal.common_distributed import MultiProcessTestCase
from torch.testing._internal.common_utils import run_tests

SET_BY_PYTEST = []


class RanksTest(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        SET_BY_PYTEST.append(True)
        self._spawn_processes()

    def test_report(self):
        out = pathlib.Path(os.environ["RANKS_OUT"]) / str(self.rank)
        out.write_text(f"{os.getppid()} {bool(SET_BY_PYTEST)}")

    def test_rank_1_fails(self):
        if self.rank == 1:
            raise AssertionError("rank 1 fails")


if __name__ == "__main__":
    run_tests()
"""


def run_cases(tmp_path: pathlib.Path, keyword: str, **env: str):
    shutil.copy(REPO / "test" / "distributed" / "conftest.py", tmp_path)
    (tmp_path / "test_ranks.py").write_text(CASES)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "test_ranks.py",
        ]
        + ["-k", keyword],
        cwd=tmp_path,
        env={**os.environ, "RANKS_OUT": str(out), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output, _ = process.communicate(timeout=300)
    reports = {p.name: p.read_text().split() for p in out.iterdir()}
    return process.pid, process.returncode, output, reports


def test_ranks_start_fresh_from_a_forkserver(tmp_path):
    pid, code, output, reports = run_cases(tmp_path, "test_report")
    assert code == 0, output
    parents = {parent for parent, _ in reports.values()}
    assert sorted(reports) == ["0", "1"] and len(parents) == 1, reports
    assert parents != {str(pid)}, "the ranks are pytest's children: spawned, not forked"
    assert {seen for _, seen in reports.values()} == {"False"}, reports


def test_spawn_on_request(tmp_path):
    pid, code, output, reports = run_cases(
        tmp_path, "test_report", DDP_UPDATE_PG_START_METHOD="spawn"
    )
    assert code == 0, output
    assert {parent for parent, _ in reports.values()} == {str(pid)}, reports


def test_a_failing_rank_fails_the_case(tmp_path):
    _, code, output, _ = run_cases(tmp_path, "test_rank_1_fails")
    assert code == 1 and "rank 1 fails" in output, output


@pytest.mark.parametrize("method", ["fork", ""])
def test_unknown_start_method(tmp_path, method):
    _, code, output, _ = run_cases(
        tmp_path, "test_report", DDP_UPDATE_PG_START_METHOD=method
    )
    assert code != 0 and "expected one of forkserver, spawn" in output, output
