"""test/distributed/conftest.py: the ranks of a MultiProcessTestCase start from a forkserver
that has torch imported, fresh, able to use CUDA, and a rank that fails still fails its case."""

import os
import pathlib
import shutil
import signal
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

# Each rank writes its parent's pid; whether that parent has libtorch loaded (a forkserver whose
# preload failed, silently, has not); whether the rank sees what pytest's process set after the
# test file was imported (a rank forked from pytest's process would); and whether CUDA is
# poisoned in it, as in a process forked after CUDA was queried.
CASES = """
import os
import pathlib
import sys

import torch
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
        parent = os.getppid()
        with open(f"/proc/{parent}/maps") as maps:
            has_torch = "libtorch" in maps.read()
        out = pathlib.Path(os.environ["RANKS_OUT"]) / str(self.rank)
        out.write_text(
            f"{parent} {has_torch} {bool(SET_BY_PYTEST)} {torch._C._cuda_isInBadFork()}"
        )

    def test_rank_1_fails(self):
        if self.rank == 1:
            raise AssertionError("rank 1 fails")


if __name__ == "__main__":
    run_tests()
"""


# Under the inner cases' own timeout (DISTRIBUTED_TESTS_DEFAULT_TIMEOUT), so that a hung rank is
# reported by MultiProcessTestCase, with its traceback, before this run is killed.
INNER_TIMEOUT_S = 60
OUTER_TIMEOUT_S = 180


def run_cases(tmp_path: pathlib.Path, keyword: str, **env: str):
    """Run the cases that ``keyword`` selects under the conftest, in a new session.

    Returns pytest's pid, its exit code, its output, and each rank's report, split. The
    variables in ``env`` are the only start method setting: the caller's own is dropped.
    """
    shutil.copy(REPO / "test" / "distributed" / "conftest.py", tmp_path)
    (tmp_path / "test_ranks.py").write_text(CASES)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    environment = {
        k: v for k, v in os.environ.items() if k != "DDP_UPDATE_PG_START_METHOD"
    }
    environment.update(
        RANKS_OUT=str(out),
        DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(INNER_TIMEOUT_S),
        **env,
    )
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    process = subprocess.Popen(
        command + ["test_ranks.py", "-k", keyword],
        cwd=tmp_path,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=OUTER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # pytest, its forkserver and the ranks: the session's whole process group.
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the cases ran over {OUTER_TIMEOUT_S} s:\n{output}")
    reports = {p.name: p.read_text().split() for p in out.iterdir()}
    return process.pid, process.returncode, output, reports


def test_ranks_start_fresh_from_a_forkserver(tmp_path):
    pid, code, output, reports = run_cases(tmp_path, "test_report")
    assert code == 0, output
    assert sorted(reports) == ["0", "1"], reports
    parents, has_torch, seen, cuda_poisoned = map(set, zip(*reports.values()))
    assert len(parents) == 1, reports
    assert parents != {str(pid)}, "the ranks are pytest's children: spawned, not forked"
    assert has_torch == {"True"}, "the forkserver has not got torch: its preload failed"
    assert seen == {"False"}, "the ranks see pytest's state: forked from pytest"
    assert cuda_poisoned == {"False"}, "CUDA cannot be initialized in the ranks"


def test_spawn_on_request(tmp_path):
    pid, code, output, reports = run_cases(
        tmp_path, "test_report", DDP_UPDATE_PG_START_METHOD="spawn"
    )
    assert code == 0, output
    assert {parent for parent, *_ in reports.values()} == {str(pid)}, reports


def test_a_failing_rank_fails_the_case(tmp_path):
    _, code, output, _ = run_cases(tmp_path, "test_rank_1_fails")
    assert code == 1 and "rank 1 fails" in output, output


def test_unknown_start_method(tmp_path):
    _, code, output, _ = run_cases(
        tmp_path, "test_report", DDP_UPDATE_PG_START_METHOD="fork"
    )
    assert code != 0 and "expected one of forkserver, spawn" in output, output
